"""Cut long audio into decoding windows at silences, for parallel long-form transcription.

A window is a sample range of at most ``max_window_samples`` (30 s for Whisper). The planner finds speech with a
detector and the segmenter, with ``max_speech_s`` set to the window so that longer speech is cut at its quietest
points, then packs consecutive segments greedily into windows: a window grows by the next segment while the
range from its first segment's start to that segment's end still fits. So every window boundary lies in a
silence the detector found, or at a forced cut inside speech longer than a window, and every sample of every
segment lies in exactly one window. Audio between windows (silence) is not decoded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from oasr.vad.detector import Audio, SpeechDetector
from oasr.vad.segmenter import SAMPLE_RATE, SegmenterOptions, SpeechSegment, speech_segments

# Long-form decoding favours keeping words over skipping noise: short blips are kept, segments get some lead-in.
LONG_FORM_SEGMENTER = SegmenterOptions(min_speech_s=0.1, min_silence_s=0.3, speech_pad_s=0.2)


@dataclass(frozen=True)
class Window:
    """Samples ``[start, end)`` of the input, decoded as one request."""

    start: int
    end: int

    @property
    def num_samples(self) -> int:
        return self.end - self.start


def pack_segments(segments: Sequence[SpeechSegment], max_window_samples: int) -> list[Window]:
    """Consecutive, non-overlapping segments (each at most ``max_window_samples``) -> windows, greedily."""
    windows: list[Window] = []
    for seg in segments:
        if seg.num_samples > max_window_samples:
            raise ValueError(f"segment {seg} is longer than a window of {max_window_samples} samples")
        if windows and seg.end - windows[-1].start <= max_window_samples:
            windows[-1] = Window(windows[-1].start, seg.end)
        else:
            windows.append(Window(seg.start, seg.end))
    return windows


def plan_windows(
    probs: np.ndarray,
    num_samples: int,
    max_window_samples: int,
    options: SegmenterOptions = LONG_FORM_SEGMENTER,
    chunk_samples: int = 512,
) -> list[Window]:
    """Windows for one stream scored as ``probs`` (one per ``chunk_samples`` chunk)."""
    max_speech_s = min(options.max_speech_s, max_window_samples / SAMPLE_RATE)
    segments = speech_segments(probs, num_samples, replace(options, max_speech_s=max_speech_s), chunk_samples)
    return pack_segments(segments, max_window_samples)


class WindowPlanner:
    """A detector plus the segmenter options: audio of any length -> windows, many streams per detector batch."""

    def __init__(
        self, detector: SpeechDetector, max_window_samples: int, options: SegmenterOptions = LONG_FORM_SEGMENTER
    ) -> None:
        if max_window_samples < detector.chunk_samples:
            raise ValueError(f"a window of {max_window_samples} samples is shorter than one detector chunk")
        self.detector = detector
        self.max_window_samples = max_window_samples
        self.options = options

    def plan(self, audios: Sequence[Audio]) -> list[list[Window]]:
        if self.detector.cuts_own_segments:
            return [pack_segments(self.own_segments(a), self.max_window_samples) for a in audios]
        probs = self.detector.speech_probs(audios)
        return [
            plan_windows(p, len(a), self.max_window_samples, self.options, self.detector.chunk_samples)
            for p, a in zip(probs, audios, strict=True)
        ]

    def own_segments(self, audio: Audio) -> list[SpeechSegment]:
        """The detector's own segments (FSMN-VAD's: FunASR's state machine) in samples, each longer than a
        window cut into equal parts that fit."""
        out = []
        for start_ms, end_ms in self.detector.segments(audio):
            start, end = start_ms * SAMPLE_RATE // 1000, min(end_ms * SAMPLE_RATE // 1000, len(audio))
            parts = -(-(end - start) // self.max_window_samples)
            bounds = [start + (end - start) * i // parts for i in range(parts + 1)]
            out += [SpeechSegment(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]
        return out
