"""``oasr serve`` under pressure: admission limit, engine queue full, timeouts and clients that leave.

The engine is the real one, slowed by ``SlowEngine`` (each window decodes 400 tokens, some seconds on CPU) so
that a request is surely still running when the test acts; every test then checks that the engine is left
with no running request and no KV block in use, and that the request's output iterator was closed early
(aborted) rather than decoded to the end.
"""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
from openai import OpenAI

import oasr
from oasr.audio import load_audio
from oasr.hosting.relay import EngineDeadError
from oasr.serving.app import build_app
from oasr.serving.settings import ServerSettings
from serving_harness import (
    WAIT_S,
    BrokenEngine,
    SlowEngine,
    engine_idle,
    metrics,
    running_server,
    small_engine,
    wait_until,
    wav_bytes,
)

JFK = Path(oasr.__file__).parent / "assets" / "jfk.flac"


@pytest.fixture(scope="module")
def engine():
    engine = small_engine("tiny.en", max_waiting=1)  # one window in the engine at a time: its queue fills fast
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def slow(engine) -> SlowEngine:
    return SlowEngine(engine)


@pytest.fixture(scope="module")
def server(slow) -> str:
    """At most one request admitted at once."""
    settings = ServerSettings(served_model_name="tiny.en", max_in_flight=1, request_timeout_s=300, retry_after_s=3)
    with running_server(build_app(slow, settings)) as url:
        yield url


@pytest.fixture(scope="module")
def hasty_server(slow) -> str:
    """Gives every request one second."""
    settings = ServerSettings(served_model_name="tiny.en", request_timeout_s=1.0)
    with running_server(build_app(slow, settings)) as url:
        yield url


def client(url: str) -> OpenAI:
    return OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=WAIT_S)


def running(url: str) -> float:
    return metrics(url)["oasr_engine_requests_running"]


def check_aborted(slow: SlowEngine, url: str, closed_before: int, finished_before: int) -> None:
    wait_until(lambda: engine_idle(url), "the engine to free the request's rows")
    assert slow.num_closed_early > closed_before
    assert slow.num_finished == finished_before, "the request decoded to the end instead of being aborted"


def test_closing_a_stream_aborts_its_request_and_frees_its_rows(slow, server):
    closed, finished = slow.num_closed_early, slow.num_finished
    stream = client(server).audio.transcriptions.create(file=(JFK.name, JFK.read_bytes()), model="tiny.en",
                                                        stream=True)
    first = next(iter(stream))
    assert first.type == "transcript.text.delta"
    assert running(server) == 1
    stream.close()
    check_aborted(slow, server, closed, finished)


def test_disconnecting_mid_request_aborts_it_and_frees_its_rows(slow, server):
    closed, finished = slow.num_closed_early, slow.num_finished
    request = httpx.Request("POST", f"{server}/v1/audio/transcriptions",
                            files={"file": (JFK.name, JFK.read_bytes())}, data={"model": "tiny.en"})
    body = request.read()
    head = "".join(f"{k}: {v}\r\n" for k, v in request.headers.items())
    port = int(server.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(f"POST /v1/audio/transcriptions HTTP/1.1\r\n{head}\r\n".encode() + body)
        wait_until(lambda: running(server) == 1, "the request to start decoding")
    check_aborted(slow, server, closed, finished)
    assert metrics(server)['oasr_http_requests_total{route="/v1/audio/transcriptions",status="499"}'] >= 1


def test_request_over_the_admission_limit_gets_429_with_retry_after(slow, server):
    closed, finished = slow.num_closed_early, slow.num_finished
    with client(server).audio.transcriptions.create(file=(JFK.name, JFK.read_bytes()), model="tiny.en",
                                                    stream=True) as stream:
        next(iter(stream))
        with pytest.raises(openai.RateLimitError) as info:
            client(server).audio.transcriptions.create(file=(JFK.name, JFK.read_bytes()), model="tiny.en")
        assert info.value.response.headers["retry-after"] == "3"
        assert info.value.body["code"] == "server_busy"
    check_aborted(slow, server, closed, finished)
    with pytest.raises(openai.NotFoundError):  # admitted again (it got past admission to the model check)
        client(server).audio.transcriptions.create(file=(JFK.name, JFK.read_bytes()), model="large-v3")


def test_full_engine_queue_gets_429_and_aborts_the_windows_already_queued(slow, server):
    closed, finished = slow.num_closed_early, slow.num_finished
    two_windows = wav_bytes(np.tile(load_audio(JFK), 3))  # 33 s: the second window finds the queue full
    with pytest.raises(openai.RateLimitError) as info:
        client(server).audio.transcriptions.create(file=("long.wav", two_windows), model="tiny.en")
    assert "queue is full" in info.value.body["message"]
    assert info.value.response.headers["retry-after"] == "3"
    check_aborted(slow, server, closed, finished)


def test_request_past_its_timeout_gets_504_and_is_aborted(slow, hasty_server):
    closed, finished = slow.num_closed_early, slow.num_finished
    with pytest.raises(openai.APIStatusError) as info:
        client(hasty_server).audio.transcriptions.create(file=(JFK.name, JFK.read_bytes()), model="tiny.en")
    assert info.value.status_code == 504
    assert info.value.body["code"] == "request_timeout"
    check_aborted(slow, hasty_server, closed, finished)


def test_stream_past_its_timeout_ends_with_an_error_event_and_is_aborted(slow, hasty_server):
    closed, finished = slow.num_closed_early, slow.num_finished
    with pytest.raises(openai.APIError) as info:  # a 504 status instead if not even the first token came in time
        for _ in client(hasty_server).audio.transcriptions.create(file=(JFK.name, JFK.read_bytes()),
                                                                  model="tiny.en", stream=True):
            pass
    assert "did not finish within 1 s" in info.value.message
    check_aborted(slow, hasty_server, closed, finished)


SECRET = "/opt/oasr-secret/kernels/decode.py"


@pytest.mark.parametrize("after", [0, 1])
def test_server_side_failure_is_a_500_that_tells_nothing(engine, after):
    broken = BrokenEngine(engine, RuntimeError(f"illegal memory access at {SECRET}:42"), after=after)
    with running_server(build_app(broken, ServerSettings(served_model_name="tiny.en"))) as url:
        with pytest.raises(openai.InternalServerError) as info:
            client(url).audio.transcriptions.create(file=(JFK.name, JFK.read_bytes()), model="tiny.en")
        assert info.value.body["type"] == "server_error"
        assert SECRET not in info.value.response.text and "illegal" not in info.value.response.text
        # A stream that already started ends with the same error as its last event.
        with pytest.raises(openai.APIError) as info:
            for _ in client(url).audio.transcriptions.create(file=(JFK.name, JFK.read_bytes()), model="tiny.en",
                                                             stream=True):
                pass
        assert "The server had an error" in info.value.message and SECRET not in info.value.message
        wait_until(lambda: engine_idle(url), "the engine to free the failed requests' rows")
        assert httpx.get(f"{url}/health").status_code == 200


def test_stopped_engine_is_a_503_and_health_says_so(engine):
    broken = BrokenEngine(engine, EngineDeadError("engine stopped: out of memory"), after=0)
    with running_server(build_app(broken, ServerSettings(served_model_name="tiny.en"))) as url:
        with pytest.raises(openai.APIStatusError) as info:
            client(url).audio.transcriptions.create(file=(JFK.name, JFK.read_bytes()), model="tiny.en")
        assert info.value.status_code == 503 and info.value.body["code"] == "engine_unavailable"
        assert "out of memory" not in info.value.response.text
        assert httpx.get(f"{url}/health").status_code == 503
