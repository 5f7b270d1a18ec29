"""Frame activity -> speaker segments, as transformers' ``Nemotron3DiarizationProcessor.extract_speaker_dict``:
a speaker talks in a frame whose probability is over the threshold; each run of such frames is a segment,
bounds rounded to 10 ms, segments sorted by start then speaker."""

from __future__ import annotations

import numpy as np

from oasr.diarization.tracker import SegmentTracker
from oasr.diarization.types import SpeakerSegment


def speaker_segments(probs: np.ndarray, frame_seconds: float, threshold: float = 0.5) -> tuple[SpeakerSegment, ...]:
    """probs: [T, S] one input's speaker probabilities over its real frames: a stream of them all at once."""
    tracker = SegmentTracker(np.shape(probs)[1], frame_seconds, threshold)
    return tuple(sorted([*tracker.update(probs), *tracker.close()], key=lambda seg: (seg.start, seg.speaker)))
