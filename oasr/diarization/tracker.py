"""Speaker segments of a stream as its frames arrive: a segment is reported once its speaker stops (or the
stream ends). ``speaker_segments`` is this tracker fed a whole input at once, so a stream's segments are those of
all its frames however they were cut."""

from __future__ import annotations

import numpy as np

from oasr.diarization.types import SpeakerSegment


class SegmentTracker:
    def __init__(self, num_speakers: int, frame_seconds: float, threshold: float = 0.5) -> None:
        self.frame_seconds, self.threshold = frame_seconds, threshold
        self.open_since: list[int | None] = [None] * num_speakers  # frame where each talking speaker started
        self.num_frames = 0

    def _segment(self, start: int, end: int, speaker: int) -> SpeakerSegment:
        return SpeakerSegment(round(float(start) * self.frame_seconds, 2), round(float(end) * self.frame_seconds, 2),
                              speaker)

    def update(self, probs: np.ndarray) -> list[SpeakerSegment]:
        """probs: [frames, speakers], the stream's next frames -> the segments that ended within them."""
        active = np.asarray(probs) > self.threshold
        was = np.array([[start is not None for start in self.open_since]])
        # every speaker's on/off changes at once: (j, s) where speaker s changes state at frame num_frames + j
        frames, speakers = np.nonzero(np.diff(np.concatenate([was, active]).astype(np.int8), axis=0))
        done = []
        for edge, speaker in zip(frames.tolist(), speakers.tolist()):  # in time order, so each speaker's alternate
            frame = self.num_frames + edge
            start = self.open_since[speaker]
            if start is None:
                self.open_since[speaker] = frame
            else:
                done.append(self._segment(start, frame, speaker))
                self.open_since[speaker] = None
        self.num_frames += active.shape[0]
        return sorted(done, key=lambda s: (s.start, s.speaker))

    def close(self) -> list[SpeakerSegment]:
        """The stream ended: the segments still open end with it."""
        done = [self._segment(start, self.num_frames, speaker)
                for speaker, start in enumerate(self.open_since) if start is not None]
        self.open_since = [None] * len(self.open_since)
        return sorted(done, key=lambda s: (s.start, s.speaker))
