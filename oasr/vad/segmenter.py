"""Per-chunk speech probabilities -> speech segments (sample ranges), one stream at a time.

The rules, in order:

1. Hysteresis. Speech starts at the first chunk with ``p >= threshold``. Inside speech, a silence begins at the
   first chunk with ``p < neg_threshold`` since the last chunk at or above ``threshold``; the segment ends at the
   silence's start once a chunk below ``neg_threshold`` is seen ``min_silence_s`` or more after it. Chunks
   between the two thresholds neither end speech nor reset a silence. Speech still open at the end of the
   stream ends with the stream.
2. Segments not longer than ``min_speech_s`` are dropped.
3. Segments longer than ``max_speech_s`` (less the padding both sides get) are cut into as few pieces as fit.
   Each cut goes to the quietest point (lowest probability averaged over ``split_smoothing_s``) among the places
   that leave the rest able to fit, and chunks below ``neg_threshold`` on either side of a cut are left out.
4. Padding. Each segment grows by ``speech_pad_s`` both sides, within the stream; where two segments are closer
   than twice the padding, the gap between them is split in halves instead, so segments never overlap.

These are the rules of silero-vad's ``get_speech_timestamps`` except for rule 3, which that function applies
while scanning (cutting at the longest silence seen so far) and which here sees the whole segment.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

SAMPLE_RATE = 16_000


@dataclass(frozen=True)
class SegmenterOptions:
    threshold: float = 0.5  # a chunk at or above this starts (or continues) speech
    neg_threshold: float | None = None  # below this, speech may end; default max(threshold - 0.15, 0.01)
    min_speech_s: float = 0.25  # shorter segments are dropped
    min_silence_s: float = 0.1  # silence that ends a segment
    speech_pad_s: float = 0.03  # added on both sides of every segment
    max_speech_s: float = math.inf  # longest segment, padding included; longer speech is cut
    split_smoothing_s: float = 0.3  # span over which probabilities are averaged to find where to cut

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"threshold must be in (0, 1], got {self.threshold}")
        if self.neg_threshold is not None and not 0.0 <= self.neg_threshold <= self.threshold:
            raise ValueError(f"neg_threshold must be in [0, threshold], got {self.neg_threshold}")
        for name in ("min_speech_s", "min_silence_s", "speech_pad_s", "split_smoothing_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.max_speech_s <= 2 * self.speech_pad_s:
            raise ValueError(f"max_speech_s ({self.max_speech_s}) must exceed twice speech_pad_s")

    @property
    def exit_threshold(self) -> float:
        return self.neg_threshold if self.neg_threshold is not None else max(self.threshold - 0.15, 0.01)


@dataclass(frozen=True)
class SpeechSegment:
    """Samples ``[start, end)`` of a 16 kHz stream."""

    start: int
    end: int

    @property
    def num_samples(self) -> int:
        return self.end - self.start


def speech_segments(
    probs: Sequence[float] | np.ndarray,
    num_samples: int,
    options: SegmenterOptions | None = None,
    chunk_samples: int = 512,
) -> list[SpeechSegment]:
    """Speech in a stream of ``num_samples`` samples scored as ``probs``, one per ``chunk_samples`` chunk."""
    options = options or SegmenterOptions()
    probs = np.asarray(probs, dtype=np.float64)
    if len(probs) != -(-num_samples // chunk_samples):
        raise ValueError(f"{len(probs)} probabilities do not cover {num_samples} samples in {chunk_samples}s")
    spans = _hysteresis(probs, num_samples, options, chunk_samples)
    min_speech = options.min_speech_s * SAMPLE_RATE
    spans = [(s, e) for s, e in spans if e - s > min_speech]
    pad = int(options.speech_pad_s * SAMPLE_RATE)
    if math.isfinite(options.max_speech_s):
        limit = int(options.max_speech_s * SAMPLE_RATE) - 2 * pad
        if limit < chunk_samples:
            raise ValueError(f"max_speech_s={options.max_speech_s} leaves less than one chunk after padding")
        spans = [piece for span in spans for piece in _split(span, probs, limit, options, chunk_samples)]
    return _pad(spans, pad, num_samples)


def _hysteresis(
    probs: np.ndarray, num_samples: int, options: SegmenterOptions, chunk_samples: int
) -> list[tuple[int, int]]:
    enter, leave = options.threshold, options.exit_threshold
    min_silence = options.min_silence_s * SAMPLE_RATE
    spans: list[tuple[int, int]] = []
    start: int | None = None
    silence_start: int | None = None
    for i, p in enumerate(probs):
        here = i * chunk_samples
        if start is None:
            if p >= enter:
                start, silence_start = here, None
        elif p >= enter:
            silence_start = None
        elif p < leave:
            silence_start = here if silence_start is None else silence_start
            if here - silence_start >= min_silence:
                spans.append((start, silence_start))
                start = None
    if start is not None:
        spans.append((start, num_samples))
    return spans


def _split(
    span: tuple[int, int], probs: np.ndarray, limit: int, options: SegmenterOptions, chunk_samples: int
) -> list[tuple[int, int]]:
    """Cut a span longer than ``limit`` samples into the fewest pieces of at most ``limit``, at quiet points."""
    start, end = span
    if end - start <= limit:
        return [span]
    limit_chunks = max(1, limit // chunk_samples)
    first, stop = start // chunk_samples, -(-end // chunk_samples)  # chunks the span touches
    width = max(1, round(options.split_smoothing_s * SAMPLE_RATE / chunk_samples))
    score = np.convolve(probs, np.ones(width) / width, mode="same")
    pieces = []
    while (stop - first) * chunk_samples > limit:
        rest = math.ceil((stop - first) / limit_chunks) - 1  # pieces left after this cut, at least one
        lo, hi = max(first + 1, stop - rest * limit_chunks), min(stop - 1, first + limit_chunks)
        cut = lo + int(np.argmin(score[lo : hi + 1]))
        pieces.append((first, cut))
        first = cut
    pieces.append((first, stop))
    leave = options.exit_threshold
    out = []
    for a, b in pieces:
        while b - a > 1 and probs[b - 1] < leave:
            b -= 1
        while b - a > 1 and probs[a] < leave:
            a += 1
        out.append((max(start, a * chunk_samples), min(end, b * chunk_samples)))
    return out


def _pad(spans: list[tuple[int, int]], pad: int, num_samples: int) -> list[SpeechSegment]:
    starts = [max(0, s - pad) for s, _ in spans]
    ends = [min(num_samples, e + pad) for _, e in spans]
    for i in range(len(spans) - 1):
        gap = spans[i + 1][0] - spans[i][1]
        if gap < 2 * pad:
            ends[i] = spans[i][1] + gap // 2
            starts[i + 1] = spans[i + 1][0] - gap // 2
    return [SpeechSegment(s, e) for s, e in zip(starts, ends, strict=True)]
