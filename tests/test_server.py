"""``oasr serve`` end to end: a real server on loopback, the real tiny.en on CPU, OpenAI's own Python client.

Every answer is compared with ``oasr.transcribe`` on the same file: the server must not change the text.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
from openai import OpenAI

import oasr
from oasr.audio import load_audio
from oasr.serving.app import build_app
from oasr.serving.formats import to_srt, to_vtt
from oasr.serving.settings import MIB, ServerSettings
from serving_harness import WAIT_S, engine_idle, metrics, running_server, small_engine, wait_until, wav_bytes
from speech_data import audio_path, english_short

JFK = Path(oasr.__file__).parent / "assets" / "jfk.flac"
API_KEY = "test-key"
MAX_AUDIO_S = 40


@pytest.fixture(scope="module")
def engine():
    engine = small_engine("tiny.en")
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def server(engine) -> str:
    settings = ServerSettings(served_model_name="tiny.en", api_keys=(API_KEY,), max_upload_bytes=2 * MIB,
                              max_audio_seconds=MAX_AUDIO_S, request_timeout_s=300)
    with running_server(build_app(engine, settings)) as url:
        yield url


@pytest.fixture(scope="module")
def client(server) -> OpenAI:
    return OpenAI(base_url=f"{server}/v1", api_key=API_KEY, max_retries=0, timeout=WAIT_S)


@pytest.fixture(scope="module")
def long_wav(tmp_path_factory) -> Path:
    """33 s (jfk three times): two 30 s windows, decoded concurrently, answered in order."""
    path = tmp_path_factory.mktemp("audio") / "jfk_x3.wav"
    path.write_bytes(wav_bytes(np.tile(load_audio(JFK), 3)))
    return path


def short_clips(count: int) -> list[Path]:
    """The ``count`` shortest English clips of the shared speech set (one or two seconds each)."""
    entries = sorted(english_short(), key=lambda e: e["duration_s"])
    return [audio_path(e) for e in entries[:count]]


@pytest.fixture(scope="module")
def offline(tiny_en, long_wav):
    """``oasr.transcribe``'s results: what the server must answer for the same files."""
    paths = [JFK, long_wav, *short_clips(8)]
    return {path: result for path, result in zip(paths, oasr.transcribe(paths, model=tiny_en))}


@pytest.fixture(scope="module")
def offline_timed(tiny_en, long_wav):
    """Decoded with timestamps: what srt, vtt and verbose_json answer by default (as the CLI's srt and vtt)."""
    paths = [JFK, long_wav]
    return {path: result for path, result in zip(paths, oasr.transcribe(paths, model=tiny_en, timestamps=True))}


def transcribe(client: OpenAI, path: Path, **kwargs):
    return client.audio.transcriptions.create(file=(path.name, path.read_bytes()), **kwargs)


def streamed(client: OpenAI, path: Path, **kwargs) -> tuple[list[str], list[str]]:
    """The stream's text deltas and done texts, in order (every event must be one of the two)."""
    deltas, done = [], []
    for event in transcribe(client, path, model="tiny.en", stream=True, **kwargs):
        if event.type == "transcript.text.delta":
            assert not done, "a delta came after the done event"
            deltas.append(event.delta)
        else:
            assert event.type == "transcript.text.done"
            done.append(event.text)
    return deltas, done


def check_verbose(result, expected) -> None:
    assert (result.text, result.language, result.duration) == (expected.text, "english", expected.duration_s)
    assert result.task == "transcribe"
    assert "".join(s.text for s in result.segments).strip() == expected.text
    assert [s.text.strip() for s in result.segments] == [s.text for s in expected.segments]
    assert [(s.start, s.end) for s in result.segments] == [(s.start, s.end) for s in expected.segments]
    assert [s.tokens for s in result.segments] == [list(s.token_ids) for s in expected.segments]
    seeks = [s.seek for s in result.segments]
    assert seeks == sorted(seeks)  # seek: the start of the segment's window (10 ms frames), windows in order
    for i, segment in enumerate(result.segments):
        assert segment.id == i and segment.seek <= round(segment.start * 100) < segment.seek + 3000
        assert segment.temperature == 0.0 and segment.compression_ratio > 0
        assert segment.avg_logprob < 0 and 0 <= segment.no_speech_prob <= 1  # measured by the engine


# ------------------------------------------------------------------------------------------ formats


def test_every_response_format_equals_offline_transcription(client, offline, offline_timed):
    expected, timed = offline[JFK], offline_timed[JFK]
    result = transcribe(client, JFK, model="tiny.en")
    assert result.text == expected.text and result.usage.seconds == expected.duration_s
    assert transcribe(client, JFK, model="whisper-1", response_format="text") == expected.text + "\n"
    assert transcribe(client, JFK, model="tiny.en", response_format="srt") == to_srt(timed)
    assert transcribe(client, JFK, model="tiny.en", response_format="vtt") == to_vtt(timed)
    check_verbose(transcribe(client, JFK, model="tiny.en", response_format="verbose_json"), timed)


def test_segment_granularity_answers_the_timestamp_tokens_segments(client, tiny_en):
    expected = oasr.transcribe(JFK, tiny_en, timestamps=True)[0]
    verbose = transcribe(client, JFK, model="tiny.en", response_format="verbose_json",
                         timestamp_granularities=["segment"])
    assert (verbose.text, verbose.language, verbose.duration) == (expected.text, "english", expected.duration_s)
    assert [(s.start, s.end, s.text.strip()) for s in verbose.segments] == [
        (s.start, s.end, s.text) for s in expected.segments
    ]
    assert len(verbose.segments) == 2 and verbose.segments[0].end == 8.0  # tiny.en closes a segment at 8.00 s
    assert "".join(s.text for s in verbose.segments).strip() == verbose.text
    assert [t for s in verbose.segments for t in s.tokens] == expected.token_ids
    for segment in verbose.segments:  # measured by the engine, as openai-whisper reports them
        assert segment.seek == 0 and segment.avg_logprob < 0 and 0 <= segment.no_speech_prob < 0.6


def test_long_audio_is_answered_window_by_window_in_order(client, long_wav, offline, offline_timed):
    expected, timed = offline[long_wav], offline_timed[long_wav]
    verbose = transcribe(client, long_wav, model="tiny.en", response_format="verbose_json")
    # Segments of both windows, in order: the second starts at the quiet cut in the 5 s before 30 s (frames of 10 ms).
    seeks = {s.seek for s in verbose.segments}
    assert len(seeks) == 2 and min(seeks) == 0 and 2500 <= max(seeks) <= 3000
    check_verbose(verbose, timed)
    assert transcribe(client, long_wav, model="tiny.en", response_format="srt") == to_srt(timed)
    deltas, done = streamed(client, long_wav)
    assert "".join(deltas) == done[0] == expected.text


def test_shared_speech_clips_equal_offline_transcription(client, offline):
    clips = short_clips(8)[-2:]
    if not clips:
        pytest.skip("shared speech data not found")
    for path in clips:
        assert offline[path].text
        assert transcribe(client, path, model="tiny.en").text == offline[path].text
        deltas, done = streamed(client, path)
        assert "".join(deltas) == done[0] == offline[path].text


# ------------------------------------------------------------------------------------------ streaming


def test_stream_sends_text_deltas_as_decoded_then_the_full_text(client, offline):
    deltas, done = streamed(client, JFK, response_format="text")
    assert done == [offline[JFK].text]
    assert "".join(deltas) == offline[JFK].text
    assert all(d and "\ufffd" not in d for d in deltas)
    assert len(deltas) > 1, "the text must arrive as it is decoded, not all at the end"


# ------------------------------------------------------------------------------------------ other routes


def test_models_lists_the_served_model_and_knows_the_alias(client):
    assert [m.id for m in client.models.list()] == ["tiny.en"]
    assert client.models.retrieve("whisper-1").id == "whisper-1"
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("large-v3")
    assert info.value.body["code"] == "model_not_found"


def test_health_and_metrics_are_open_and_count_requests(client, server):
    assert httpx.get(f"{server}/health").json() == {"status": "ok", "model": "tiny.en", "version": oasr.__version__}
    transcribe(client, JFK, model="tiny.en")
    values = metrics(server)
    assert values['oasr_http_requests_total{route="/v1/audio/transcriptions",status="200"}'] >= 1
    assert values["oasr_audio_seconds_total"] >= 11.0
    assert values["oasr_request_first_token_seconds_count"] >= 1
    assert values["oasr_request_total_seconds_count"] >= 1
    assert values["oasr_request_queue_seconds_count"] >= 1
    assert values["oasr_engine_kv_blocks_total"] > 0 and values["oasr_engine_slots"] > 0


# ------------------------------------------------------------------------------------------ refusals

JFK_FILE = {"file": ("jfk.flac", JFK.read_bytes())}
# case: (multipart files, other form fields, status, error code, words the message must contain)
ERRORS = {
    "non-audio": ({"file": ("notes.wav", b"these are not the samples you are looking for" * 50)}, {},
                  400, "invalid_audio", "notes.wav"),
    "empty": ({"file": ("empty.wav", b"")}, {}, 400, "invalid_audio", "empty"),
    "truncated": ({"file": ("half.flac", JFK.read_bytes()[: JFK.stat().st_size // 2])}, {}, 400, "invalid_audio",
                  "half.flac"),
    "oversize": ({"file": ("big.wav", bytes(3 * MIB))}, {}, 413, "file_too_large", "2 MB"),
    "too long": ({"file": ("long.wav", wav_bytes(np.zeros(45 * 16_000)))}, {}, 400, "audio_too_long", "40 s"),
    "file as text": ({"file": (None, b"jfk.flac")}, {}, 400, None, "'file' must be an uploaded file"),
    "no file": ({"language": (None, b"en")}, {}, 400, None, "Missing required parameter: 'file'"),
    "not multipart": ({}, {}, 400, None, "multipart/form-data"),
    "no model": ({**JFK_FILE, "language": (None, b"en")}, {"model": None}, 400, None, "'model'"),
    "temperature not a number": (JFK_FILE, {"temperature": "hot"}, 400, "invalid_value", "temperature"),
    "unknown response_format": (JFK_FILE, {"response_format": "xml"}, 400, "invalid_value", "response_format"),
    "stream not a boolean": (JFK_FILE, {"stream": "sometimes"}, 400, "invalid_value", "stream"),
    "unknown field": (JFK_FILE, {"chunking_strategy": "auto"}, 400, None, "chunking_strategy"),
    "field twice": (JFK_FILE, {"language": ["en", "de"]}, 400, None, "more than once"),
    "unknown model": (JFK_FILE, {"model": "gpt-4o-transcribe"}, 404, "model_not_found", "gpt-4o-transcribe"),
    "language it cannot serve": (JFK_FILE, {"language": "de"}, 400, "unsupported_option", "English-only"),
    "granularity without verbose_json": (JFK_FILE, {"timestamp_granularities[]": "segment"}, 400, None,
                                         "verbose_json"),
    "words without verbose_json": (JFK_FILE, {"timestamp_granularities[]": "word"}, 400, None, "verbose_json"),
    "temperature above 1": (JFK_FILE, {"temperature": "1.2"}, 400, "invalid_value", "temperature"),
    "streamed subtitles": (JFK_FILE, {"stream": "true", "response_format": "srt"}, 400, None, "json or text"),
    "streamed words": (JFK_FILE, {"stream": "true", "response_format": "verbose_json",
                                  "timestamp_granularities[]": "word"}, 400, None, "json or text"),
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_bad_requests_get_openai_errors_saying_why(server, case):
    files, fields, status, code, says = ERRORS[case]
    form = {k: v for k, v in {"model": "tiny.en", **fields}.items() if v is not None}
    response = httpx.post(f"{server}/v1/audio/transcriptions", files=files or None, data=form,
                          headers={"Authorization": f"Bearer {API_KEY}"}, timeout=WAIT_S)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code and says in error["message"], error
    assert "Traceback" not in response.text and "/work/" not in response.text and "site-packages" not in response.text
    assert httpx.get(f"{server}/health").status_code == 200


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the openai package marks translations deprecated
def test_translation_is_refused_by_an_english_only_model(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.audio.translations.create(file=(JFK.name, JFK.read_bytes()), model="tiny.en")
    assert "cannot translate" in info.value.body["message"]


def test_oversize_upload_is_413_for_the_openai_client(client):
    with pytest.raises(openai.APIStatusError) as info:
        client.audio.transcriptions.create(file=("big.wav", bytes(3 * MIB)), model="tiny.en")
    assert info.value.status_code == 413


def test_missing_or_wrong_api_key_is_401(server):
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": API_KEY}):
        response = httpx.get(f"{server}/v1/models", headers=headers)
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "invalid_api_key"
    response = httpx.post(f"{server}/v1/audio/transcriptions", files={"file": ("jfk.flac", JFK.read_bytes())},
                          data={"model": "tiny.en"})
    assert response.status_code == 401
    with pytest.raises(openai.AuthenticationError):
        OpenAI(base_url=f"{server}/v1", api_key="wrong", max_retries=0).models.list()


def test_unknown_routes_answer_in_openai_shape(server):
    response = httpx.get(f"{server}/v1/nothing-here", headers={"Authorization": f"Bearer {API_KEY}"})
    assert response.status_code == 404 and "Unknown request URL" in response.json()["error"]["message"]


def test_server_still_serves_after_bad_input(client, server, offline):
    assert transcribe(client, JFK, model="tiny.en").text == offline[JFK].text
    wait_until(lambda: engine_idle(server), "the engine to be idle")
    assert metrics(server)['oasr_http_requests_total{route="/v1/audio/transcriptions",status="400"}'] >= 1


# ------------------------------------------------------------------------------------------ load


def test_32_concurrent_clients_all_get_offline_texts(client, server, offline):
    clips = short_clips(8)
    if not clips:
        pytest.skip("shared speech data not found")
    jobs = [clips[i % len(clips)] for i in range(32)]

    def one(i: int) -> tuple[Path, str]:
        path = jobs[i]
        if i % 4 == 3:  # a quarter of them streamed
            deltas, done = streamed(client, path)
            assert "".join(deltas) == done[0]
            return path, done[0]
        return path, transcribe(client, path, model="tiny.en").text

    with ThreadPoolExecutor(max_workers=32) as pool:
        results = list(pool.map(one, range(32)))
    assert [text for _, text in results] == [offline[path].text for path in jobs]
    wait_until(lambda: engine_idle(server), "the engine to be idle")
