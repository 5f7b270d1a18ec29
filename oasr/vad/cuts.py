"""Cut long audio into contiguous windows at the quietest point before each window's end.

Default (parallel) long-form decodes windows of at most ``window`` samples independently. Cut every 30 s, a
boundary falls wherever it falls, often inside a word: each window then decodes half of it ("self-toot-cruise."
and "rule, thou"). Here each window instead ends at the quietest run of audio among the last ``search_s`` before
its 30 s limit, and the next window starts there, so the windows still cover the input with no gap and no
overlap, each at most ``window`` samples. Unlike the VAD planner (``oasr.vad.planner``), nothing is skipped: a
window whose decode stops short is continued from its timestamps as before (``oasr.transcription.parallel``).

Quietness is the mean power of ``run_s`` of audio centred on the cut, on a 10 ms grid: a pause between two words
of read speech is 0.1 to 0.5 s and 20 to 40 dB below the words, while the closure of a stop consonant inside a
word is a few tens of ms, shorter than the run, so its run still holds the loud sounds either side. Among runs within
``tolerance_db`` of the quietest the latest wins, to keep windows long (fewer of them, more context each).
NumPy only and reading only the search spans, so the server's API processes plan hours of audio cheaply.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SAMPLE_RATE = 16_000
FRAME_SAMPLES = 160  # 10 ms: the grid cuts are placed on (Whisper's hop)
_FLOOR_POWER = 1e-12  # -120 dBFS, given to digital silence instead of log(0)


@dataclass(frozen=True)
class QuietCutOptions:
    search_s: float = 5.0  # how far before a window's limit its end may move (capped at half the window)
    run_s: float = 0.2  # the span of audio whose mean power scores a cut (centred on it)
    tolerance_db: float = 1.0  # runs this close to the quietest count as quiet; the latest of them wins

    def __post_init__(self) -> None:
        if self.search_s <= 0:
            raise ValueError(f"search_s must be > 0, got {self.search_s}")
        if self.run_s <= 0:
            raise ValueError(f"run_s must be > 0, got {self.run_s}")
        if self.tolerance_db < 0:
            raise ValueError(f"tolerance_db must be >= 0, got {self.tolerance_db}")


def quiet_cut(samples: np.ndarray, lo: int, hi: int, options: QuietCutOptions) -> int:
    """The cut in ``[lo, hi]`` (sample indices, on the 10 ms grid where it fits) whose centred run of
    ``options.run_s`` is quietest; the latest within ``tolerance_db`` of the quietest."""
    if hi <= lo:
        return hi
    half = max(1, round(options.run_s * SAMPLE_RATE / FRAME_SAMPLES / 2))  # frames either side of a cut
    first = -(-lo // FRAME_SAMPLES)  # candidate cuts: frame boundaries first * FRAME_SAMPLES ... last * ...
    last = hi // FRAME_SAMPLES
    if last < first:
        return hi
    origin = max(0, first - half)  # the region's first frame
    region = samples[origin * FRAME_SAMPLES : (last + half) * FRAME_SAMPLES].astype(np.float64)
    num_frames = -(-len(region) // FRAME_SAMPLES)
    if num_frames == 0:  # the span lies past the input's end: nothing to hear
        return hi
    squares = np.zeros(num_frames * FRAME_SAMPLES)
    squares[: len(region)] = np.square(region)
    counts = np.full(num_frames, FRAME_SAMPLES)
    counts[-1] = len(region) - (num_frames - 1) * FRAME_SAMPLES  # the input may end inside its last frame
    sums = np.concatenate([[0.0], np.cumsum(squares.reshape(num_frames, FRAME_SAMPLES).sum(axis=1))])
    sizes = np.concatenate([[0], np.cumsum(counts)])
    cuts = np.arange(first, last + 1)  # in frames of the whole input
    a = np.clip(cuts - half - origin, 0, num_frames)  # each cut's run, in frames of the region
    b = np.clip(cuts + half - origin, 0, num_frames)
    mean = (sums[b] - sums[a]) / np.maximum(sizes[b] - sizes[a], 1)
    level = 10 * np.log10(np.maximum(mean, _FLOOR_POWER))
    quiet = np.flatnonzero(level <= level.min() + options.tolerance_db)
    return int(cuts[quiet[-1]]) * FRAME_SAMPLES


def quiet_spans(samples: np.ndarray, window: int, options: QuietCutOptions | None = None) -> list[tuple[int, int]]:
    """Contiguous spans ``[start, end)`` covering ``samples``, each at most ``window`` long, each cut (but the
    input's end) at the quietest point of the ``search_s`` before the window's limit."""
    if window <= 0:
        raise ValueError(f"window must be > 0 samples, got {window}")
    options = options or QuietCutOptions()
    search = min(round(options.search_s * SAMPLE_RATE), window // 2)  # every window advances by half a window
    num_samples = len(samples)
    if num_samples == 0:
        return []
    spans: list[tuple[int, int]] = []
    start = 0
    while num_samples - start > window:
        limit = start + window
        cut = quiet_cut(samples, limit - search, limit, options)
        spans.append((start, cut))
        start = cut
    spans.append((start, num_samples))
    return spans
