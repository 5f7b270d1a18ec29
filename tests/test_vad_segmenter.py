"""The VAD segmenter and the long-form window planner on fabricated probabilities (pure logic, CPU)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from oasr.vad.planner import Window, pack_segments, plan_windows
from oasr.vad.segmenter import SegmenterOptions, SpeechSegment, speech_segments

C = 512  # samples per chunk
# 0.1 s of silence = 1600 samples: the segment ends at the 5th quiet chunk (4 * 512 >= 1600 > 3 * 512).
PLAIN = SegmenterOptions(threshold=0.5, neg_threshold=0.35, min_speech_s=0.0, min_silence_s=0.1, speech_pad_s=0.0)


def spans(probs: list[float], options: SegmenterOptions = PLAIN, num_samples: int | None = None) -> list[tuple]:
    n = len(probs) * C if num_samples is None else num_samples
    return [(s.start // C, s.end // C) if s.end % C == 0 else (s.start / C, s.end / C)
            for s in speech_segments(np.array(probs), n, options, C)]


def test_speech_starts_at_threshold_and_ends_at_the_start_of_a_long_enough_silence() -> None:
    probs = [0.0] * 2 + [0.9] * 10 + [0.1] * 5 + [0.9] * 10 + [0.1] * 3 + [0.9] * 5 + [0.0] * 6
    # the 3-chunk dip (chunks 27-29) is shorter than min_silence and does not split the second segment
    assert spans(probs) == [(2, 12), (17, 35)]


def test_four_quiet_chunks_do_not_end_speech_but_five_do() -> None:
    assert spans([0.9] * 4 + [0.1] * 4 + [0.9] * 4) == [(0, 12)]
    assert spans([0.9] * 4 + [0.1] * 5 + [0.9] * 4) == [(0, 4), (9, 13)]


def test_chunks_between_the_thresholds_neither_start_nor_end_speech_nor_reset_a_silence() -> None:
    assert spans([0.4] * 20) == []
    assert spans([0.9] * 5 + [0.4] * 20 + [0.9] * 2) == [(0, 27)]
    # the silence counts from its first quiet chunk through middle-band chunks: ends at chunk 5
    assert spans([0.9] * 5 + [0.1, 0.4, 0.4, 0.4, 0.1] + [0.9] * 3) == [(0, 5), (10, 13)]
    # a chunk at or above threshold resets it
    assert spans([0.9] * 5 + [0.1, 0.4, 0.6, 0.4, 0.1] + [0.9] * 3) == [(0, 13)]


def test_speech_open_at_the_end_ends_with_the_stream() -> None:
    num_samples = 10 * C - 100  # the last chunk is partial
    assert speech_segments(np.array([0.0] * 6 + [0.9] * 4), num_samples, PLAIN, C) == [
        SpeechSegment(6 * C, num_samples)
    ]


def test_segments_not_longer_than_min_speech_are_dropped() -> None:
    options = SegmenterOptions(min_speech_s=5 * C / 16000, min_silence_s=0.1, speech_pad_s=0.0)
    probs = [0.9] * 5 + [0.0] * 6 + [0.9] * 6 + [0.0] * 6
    assert spans(probs, options) == [(11, 17)]


def test_padding_grows_segments_within_the_stream_and_splits_short_gaps_in_half() -> None:
    options = SegmenterOptions(min_speech_s=0.0, min_silence_s=0.1, speech_pad_s=0.05)  # 800 samples
    probs = [0.9] * 6 + [0.0] * 6 + [0.9] * 6 + [0.0] * 20 + [0.9] * 6
    n = len(probs) * C
    got = speech_segments(np.array(probs), n, options, C)
    gap = 12 * C - 6 * C  # 3072 > 2 * 800: both sides get the full padding
    assert gap > 1600
    assert got == [SpeechSegment(0, 6 * C + 800), SpeechSegment(12 * C - 800, 18 * C + 800),
                   SpeechSegment(38 * C - 800, n)]
    wide = SegmenterOptions(min_speech_s=0.0, min_silence_s=0.1, speech_pad_s=0.2)  # 3200 > gap / 2
    got = speech_segments(np.array(probs), n, wide, C)
    assert got[0] == SpeechSegment(0, 6 * C + gap // 2)
    assert got[1].start == 12 * C - gap // 2
    assert all(a.end <= b.start for a, b in itertools.pairwise(got))


def test_long_speech_is_cut_at_its_quietest_point_and_quiet_chunks_stay_out() -> None:
    probs = [0.9] * 100
    probs[58:63] = [0.05] * 5  # a dip too short to end speech under min_silence 1 s
    options = SegmenterOptions(min_speech_s=0.0, min_silence_s=1.0, speech_pad_s=0.0, max_speech_s=80 * C / 16000)
    assert spans(probs, options) == [(0, 58), (63, 100)]


def test_speech_without_a_pause_is_cut_into_the_fewest_pieces_that_fit() -> None:
    max_chunks = 80
    options = SegmenterOptions(min_speech_s=0.0, speech_pad_s=0.1, max_speech_s=max_chunks * C / 16000)
    rng = np.random.default_rng(0)
    probs = 0.7 + 0.3 * rng.random(300)
    n = 300 * C
    got = speech_segments(probs, n, options, C)
    limit_chunks = (max_chunks * C - 2 * 1600) // C  # room left for speech once both sides are padded: 73
    assert len(got) == -(-300 // limit_chunks) == 5
    assert all(s.num_samples <= max_chunks * C for s in got)
    assert got[0].start == 0 and got[-1].end == n
    assert all(a.end == b.start for a, b in itertools.pairwise(got))  # nothing lost between the pieces


@pytest.mark.parametrize(
    "kwargs", [{"threshold": 0.0}, {"threshold": 0.5, "neg_threshold": 0.6}, {"min_silence_s": -1.0},
               {"max_speech_s": 0.05, "speech_pad_s": 0.03}]
)
def test_invalid_options_are_refused(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        SegmenterOptions(**kwargs)


def test_probabilities_must_cover_the_stream() -> None:
    with pytest.raises(ValueError, match="do not cover"):
        speech_segments(np.zeros(3), 10 * C, PLAIN, C)


def test_pack_segments_fills_windows_greedily() -> None:
    segments = [SpeechSegment(0, 10), SpeechSegment(12, 20), SpeechSegment(25, 31), SpeechSegment(40, 45)]
    assert pack_segments(segments, 20) == [Window(0, 20), Window(25, 45)]
    assert pack_segments(segments, 30) == [Window(0, 20), Window(25, 45)]
    assert pack_segments(segments, 31) == [Window(0, 31), Window(40, 45)]
    with pytest.raises(ValueError, match="longer than a window"):
        pack_segments([SpeechSegment(0, 50)], 20)


def _random_stream(rng: np.random.Generator, num_chunks: int) -> np.ndarray:
    """Speech and silence runs of random lengths (some longer than a window), with noisy probabilities."""
    probs, speech = [], bool(rng.integers(2))
    while len(probs) < num_chunks:
        run = int(rng.integers(1, 1200 if speech else 80))
        level = rng.uniform(0.55, 1.0, run) if speech else rng.uniform(0.0, 0.45, run)
        probs.extend(level)
        speech = not speech
    return np.array(probs[:num_chunks])


@pytest.mark.parametrize("seed", range(12))
def test_windows_cover_every_speech_chunk_in_order_and_none_exceeds_the_maximum(seed: int) -> None:
    rng = np.random.default_rng(seed)
    num_chunks = int(rng.integers(50, 6000))
    num_samples = num_chunks * C - int(rng.integers(0, C))
    probs = _random_stream(rng, num_chunks)
    max_window = int(rng.choice([30 * 16000, 10 * 16000, 4 * 16000]))
    options = SegmenterOptions(min_speech_s=0.0, min_silence_s=0.3, speech_pad_s=0.2)
    windows = plan_windows(probs, num_samples, max_window, options, C)
    assert all(w.num_samples <= max_window for w in windows)
    assert all(0 <= w.start < w.end <= num_samples for w in windows)
    assert all(a.end <= b.start for a, b in itertools.pairwise(windows))
    covered = np.zeros(num_samples, dtype=bool)
    for w in windows:
        covered[w.start : w.end] = True
    for i in np.flatnonzero(probs >= options.threshold):
        assert covered[i * C : min((i + 1) * C, num_samples)].all(), f"speech chunk {i} is outside every window"


def test_no_speech_gives_no_windows_and_short_audio_one() -> None:
    assert plan_windows(np.zeros(100), 100 * C, 30 * 16000) == []
    assert plan_windows(np.full(100, 0.9), 100 * C, 30 * 16000) == [Window(0, 100 * C)]
