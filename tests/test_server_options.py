"""``oasr serve`` with the request fields that steer decoding: ``prompt``, ``temperature``, word timestamps and
OASR's beam-search extension fields, through OpenAI's own client, each against ``oasr.transcribe`` with the same options on the same file."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
from openai import OpenAI

import oasr
from oasr.audio import load_audio
from oasr.serving.app import build_app
from oasr.serving.settings import ServerSettings
from oasr.vad.cuts import quiet_spans
from serving_harness import WAIT_S, RecordingEngine, engine_idle, running_server, small_engine, wait_until, wav_bytes

JFK = Path(oasr.__file__).parent / "assets" / "jfk.flac"
# Lower case without punctuation: tiny.en writes JFK's sentence in the prompt's style.
PROMPT = "and so my fellow americans ask not"
WORD_TOLERANCE_S = 0.01


@pytest.fixture(scope="module")
def engine():
    engine = small_engine("tiny.en")
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def recorder(engine) -> RecordingEngine:
    return RecordingEngine(engine)


@pytest.fixture(scope="module")
def server(recorder) -> str:
    with running_server(build_app(recorder, ServerSettings(served_model_name="tiny.en", request_timeout_s=300))) as url:
        yield url


@pytest.fixture(scope="module")
def client(server) -> OpenAI:
    return OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=WAIT_S)


@pytest.fixture(scope="module")
def short_wav(tmp_path_factory) -> Path:
    """JFK's first 3 s ("And so my fellow Americans")."""
    path = tmp_path_factory.mktemp("audio") / "jfk_3s.wav"
    path.write_bytes(wav_bytes(load_audio(JFK)[: 3 * 16_000]))
    return path


@pytest.fixture(scope="module")
def long_wav(tmp_path_factory) -> Path:
    """33 s (jfk three times): two windows, the second one 3 s long."""
    path = tmp_path_factory.mktemp("audio") / "jfk_x3.wav"
    path.write_bytes(wav_bytes(np.tile(load_audio(JFK), 3)))
    return path


def transcribe(client: OpenAI, path: Path, **kwargs):
    return client.audio.transcriptions.create(file=(path.name, path.read_bytes()), model="tiny.en", **kwargs)


def streamed_text(client: OpenAI, path: Path, **kwargs) -> str:
    """The stream's deltas joined, checked against its done event."""
    events = list(transcribe(client, path, stream=True, **kwargs))
    assert [e.type for e in events[:-1]] == ["transcript.text.delta"] * (len(events) - 1)
    assert events[-1].type == "transcript.text.done"
    assert "".join(e.delta for e in events[:-1]) == events[-1].text
    return events[-1].text


def verbose_tokens(verbose) -> list[int]:
    return [t for s in verbose.segments for t in s.tokens]


def offline_words(result) -> list[tuple[str, float, float]]:
    return [(w.word.strip(), w.start, w.end) for s in result.segments for w in s.words]


def assert_same_words(served, expected: list[tuple[str, float, float]]) -> None:
    assert [w.word for w in served] == [word for word, _, _ in expected]
    for w, (_, start, end) in zip(served, expected, strict=True):
        assert abs(w.start - start) <= WORD_TOLERANCE_S and abs(w.end - end) <= WORD_TOLERANCE_S, (w, start, end)


# ------------------------------------------------------------------------------------------ prompt


def test_prompt_conditions_every_window_as_offline(client, tiny_en, long_wav):
    plain, prompted = (oasr.transcribe(JFK, tiny_en, prompt=p)[0] for p in (None, PROMPT))
    assert prompted.text != plain.text, "the prompt changes nothing: the comparison could not fail"
    assert streamed_text(client, JFK, prompt=PROMPT) == prompted.text
    # Both windows of a longer input are conditioned on it, as in oasr.transcribe's parallel mode (verbose_json
    # decodes timestamps).
    expected = oasr.transcribe(long_wav, tiny_en, prompt=PROMPT, timestamps=True)[0]
    verbose = transcribe(client, long_wav, prompt=PROMPT, response_format="verbose_json")
    (_, cut), _ = quiet_spans(load_audio(long_wav), 480_000)  # the second window starts at the quiet cut
    assert {s.seek for s in verbose.segments} == {0, cut // 160} and verbose_tokens(verbose) == expected.token_ids
    assert verbose.text == expected.text


# ------------------------------------------------------------------------------------------ temperature


def test_temperature_above_zero_samples_at_that_temperature(client, recorder):
    recorder.options.clear()
    verbose = transcribe(client, JFK, temperature=0.6, response_format="verbose_json")
    assert len(verbose.text.split()) >= 10  # a sampled sentence, whatever its words (JFK says 22)
    assert {s.temperature for s in verbose.segments} == {0.6}
    assert streamed_text(client, JFK, temperature=0.6)
    transcribe(client, JFK)
    # What the engine was asked: sampling at 0.6 for both sampled requests, greedy for the plain one.
    assert [o.temperature for o in recorder.options] == [0.6, 0.6, 0.0]


# ------------------------------------------------------------------------------------------ beam search


def test_beam_fields_search_as_offline(client, recorder, tiny_en):
    expected = oasr.transcribe(JFK, tiny_en, beam_size=3, patience=2.0)[0]
    timed = oasr.transcribe(JFK, tiny_en, beam_size=3, patience=2.0, timestamps=True)[0]  # as verbose_json decodes
    recorder.options.clear()
    verbose = transcribe(client, JFK, response_format="verbose_json",
                         extra_body={"beam_size": 3, "patience": 2.0})
    assert verbose_tokens(verbose) == timed.token_ids and verbose.text == timed.text
    assert streamed_text(client, JFK, extra_body={"beam_size": 3, "patience": 2.0}) == expected.text
    assert [(o.beam_size, o.patience) for o in recorder.options] == [(3, 2.0), (3, 2.0)]


@pytest.mark.parametrize(("fields", "param", "says"), [
    ({"temperature": 0.5, "extra_body": {"beam_size": 2}}, "beam_size", "temperature 0"),
    ({"extra_body": {"patience": 2.0}}, "patience", "give beam_size too"),
    ({"extra_body": {"length_penalty": 0.5}}, "length_penalty", "give beam_size too"),
    ({"extra_body": {"beam_size": 0}}, "beam_size", "greater than or equal to 1"),
])
def test_contradicting_or_invalid_beam_fields_are_400s(client, fields, param, says):
    with pytest.raises(openai.BadRequestError) as info:
        transcribe(client, JFK, **fields)
    assert info.value.body["param"] == param and says in info.value.body["message"], info.value.body
    assert transcribe(client, JFK).text  # and the next request is served


# ------------------------------------------------------------------------------------------ words


def test_word_granularity_answers_offline_words(client, server, tiny_en, short_wav):
    expected = oasr.transcribe(JFK, tiny_en, word_timestamps=True)[0]
    verbose = transcribe(client, JFK, response_format="verbose_json", timestamp_granularities=["word"])
    assert verbose.text == expected.text and verbose.segments is None  # words only, as OpenAI answers
    words = verbose.words
    assert len(words) == len(expected.text.split())
    assert " ".join(w.word for w in words) == expected.text
    assert all(0.0 <= w.start <= w.end <= verbose.duration for w in words)
    assert all(a.end <= b.start for a, b in zip(words, words[1:]))
    assert_same_words(words, offline_words(expected))
    # The plain verbose_json answer is unchanged: segments and no words.
    response = httpx.post(f"{server}/v1/audio/transcriptions", files={"file": ("clip.wav", short_wav.read_bytes())},
                          data={"model": "tiny.en", "response_format": "verbose_json"}, timeout=WAIT_S)
    assert "segments" in response.json() and "words" not in response.json()


def test_word_and_segment_granularities_answer_both_across_windows(client, tiny_en, long_wav):
    expected = oasr.transcribe(long_wav, tiny_en, timestamps=True, word_timestamps=True)[0]
    verbose = transcribe(client, long_wav, response_format="verbose_json",
                         timestamp_granularities=["word", "segment"])
    assert verbose.text == expected.text
    assert [(s.start, s.end) for s in verbose.segments] == [(s.start, s.end) for s in expected.segments]
    assert verbose_tokens(verbose) == [t for s in expected.segments for t in s.token_ids]
    assert_same_words(verbose.words, offline_words(expected))
    assert verbose.words[-1].start >= 30.0  # the second window's words are placed in the input's time
    assert "".join(w.word for w in verbose.words) == verbose.text.replace(" ", "")


class SilentAligner(RecordingEngine):
    """The real engine, except that word alignments never answer."""

    def __init__(self, engine) -> None:
        super().__init__(engine)
        self.num_waiting = 0
        self.num_given_up = 0

    async def align_words(self, rows, audio):
        self.num_waiting += 1
        try:
            await asyncio.Event().wait()
        finally:
            self.num_given_up += 1


def test_alignment_past_the_request_timeout_is_a_504(engine, short_wav):
    silent = SilentAligner(engine)
    # 5 s: decoding 3 s of audio takes well under that; the alignment then waits out the rest.
    with running_server(build_app(silent, ServerSettings(served_model_name="tiny.en", request_timeout_s=5))) as url:
        client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=WAIT_S)
        with pytest.raises(openai.APIStatusError) as info:
            transcribe(client, short_wav, response_format="verbose_json", timestamp_granularities=["word"])
        assert info.value.status_code == 504 and info.value.body["code"] == "request_timeout"
        assert (silent.num_waiting, silent.num_given_up) == (1, 1)
        wait_until(lambda: engine_idle(url), "the engine to be idle")
        assert httpx.get(f"{url}/health").status_code == 200
