"""Frame activity -> speaker segments, as transformers' ``Nemotron3DiarizationProcessor.extract_speaker_dict``:
a speaker talks in a frame whose probability is over the threshold; each run of such frames is a segment,
bounds rounded to 10 ms, segments sorted by start then speaker."""

from __future__ import annotations

import numpy as np

from oasr.diarization.types import SpeakerSegment


def speaker_segments(probs: np.ndarray, frame_seconds: float, threshold: float = 0.5) -> tuple[SpeakerSegment, ...]:
    """probs: [T, S] one input's speaker probabilities over its real frames."""
    active = (np.asarray(probs) > threshold).astype(np.int8)
    edges = np.diff(np.pad(active, ((1, 1), (0, 0))), axis=0)  # +1 where a speaker starts, -1 where it stops
    segments = []
    for speaker in range(active.shape[1]):
        starts = np.flatnonzero(edges[:, speaker] == 1)
        ends = np.flatnonzero(edges[:, speaker] == -1)
        segments.extend(SpeakerSegment(round(float(s) * frame_seconds, 2), round(float(e) * frame_seconds, 2), speaker)
                        for s, e in zip(starts, ends))
    return tuple(sorted(segments, key=lambda seg: (seg.start, seg.speaker)))
