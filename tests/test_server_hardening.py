"""``oasr serve`` against clients that try to starve or trick it (slow uploads and slow request heads, one
client or API key taking every place, foreign Host headers), and what it answers and declares (timestamps by
default, the engine's measurements, the OpenAPI form, CORS), and how it stops on a signal.

Slow clients are raw sockets that send their request a little at a time; "other clients" connect from
another loopback address (all of 127.0.0.0/8 is loopback on Linux), as a second machine would.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import pytest
import uvicorn

import oasr
from oasr.audio import load_audio
from oasr.cli import _serve_settings, build_parser
from oasr.serving.app import build_app, stopped_by_signals
from oasr.serving.connections import uvicorn_config
from oasr.serving.formats import to_srt, to_vtt
from oasr.serving.hosts import AllowedHostsMiddleware, host_name
from oasr.serving.settings import LOOPBACK_HOSTS, ServerSettings
from oasr.serving.verbose import verbose_segments
from oasr.transcription.results import decoded_window
from oasr.types import DecodeOptions
from serving_harness import WAIT_S, SlowEngine, running_server, small_engine, wait_until, wav_bytes

JFK = Path(oasr.__file__).parent / "assets" / "jfk.flac"
SLOW_PEER = "127.0.0.2"  # the slow or greedy client
OTHER_PEER = "127.0.0.1"  # everybody else
BOUNDARY = "oasr-slow-boundary"
TRICKLE_S = 0.5  # a slow client sends one byte this often
ANSWER_S = 30  # far past the 1 s deadlines tested: only a connection left open forever should hit it


@pytest.fixture(scope="module")
def engine():
    engine = small_engine("tiny.en")
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def short_wav() -> bytes:
    return wav_bytes(load_audio(JFK)[: 3 * 16_000])  # "And so my fellow Americans": decodes in a moment


class CountingApp:
    """Counts the HTTP requests that reached the app (their headers were complete)."""

    def __init__(self, app) -> None:
        self.app = app
        self.num_started = 0

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1/audio/"):
            self.num_started += 1
        await self.app(scope, receive, send)


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def slow_upload_head(content_length: int = 1 << 20, extra_headers: str = "") -> bytes:
    """A transcription request's head announcing a body that will take forever to come."""
    return (f"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\nContent-Length: {content_length}\r\n"
            f"{extra_headers}\r\n--{BOUNDARY}\r\n").encode()


@contextmanager
def slow_uploads(url: str, count: int, peer: str = SLOW_PEER, extra_headers: str = "") -> Iterator[list[socket.socket]]:
    """``count`` connections from ``peer`` whose uploads trickle in, one byte per TRICKLE_S each, until the
    block ends."""
    stop = threading.Event()
    with ExitStack() as stack:
        sockets = []
        for _ in range(count):
            sock = stack.enter_context(socket.create_connection(("127.0.0.1", port_of(url)), timeout=ANSWER_S,
                                                                source_address=(peer, 0)))
            sock.sendall(slow_upload_head(extra_headers=extra_headers))
            sockets.append(sock)

        def trickle() -> None:
            while not stop.wait(TRICKLE_S):
                for sock in sockets:
                    try:
                        sock.send(b"x")
                    except OSError:  # answered and closed by the server
                        pass

        thread = threading.Thread(target=trickle, name="oasr-test-trickle", daemon=True)
        thread.start()
        try:
            yield sockets
        finally:
            stop.set()
            thread.join(timeout=WAIT_S)


def http_from(peer: str) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(local_address=peer), timeout=WAIT_S)


def post_audio(http: httpx.Client, url: str, wav: bytes, **headers: str) -> httpx.Response:
    return http.post(f"{url}/v1/audio/transcriptions", files={"file": ("short.wav", wav)},
                     data={"model": "tiny.en"}, headers=headers)


# ------------------------------------------------------------------------------------------ slow clients

NUM_SLOW = 16
NUM_NORMAL = 4


def test_slow_uploads_take_no_queue_place_so_other_clients_are_served(engine, short_wav):
    settings = ServerSettings(served_model_name="tiny.en", max_in_flight=4)
    app = CountingApp(build_app(engine, settings))
    with running_server(app) as url, slow_uploads(url, NUM_SLOW):
        wait_until(lambda: app.num_started == NUM_SLOW, "the slow uploads to reach the app")
        with http_from(OTHER_PEER) as http:
            statuses = [post_audio(http, url, short_wav).status_code for _ in range(NUM_NORMAL)]
        print(f"\n{NUM_SLOW} slow uploads (max_in_flight 4): {statuses.count(200)} of {NUM_NORMAL} normal "
              f"requests served, {statuses.count(429)} refused with 429")
        assert statuses == [200] * NUM_NORMAL


def response_of(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (or the socket's timeout passes: then the
    test fails). A reset fails the test too: the server lingers over a close while its client may still be
    sending, so a trickled byte it has not read cannot turn its close into a reset that could cost the answer."""
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


def test_slow_body_gets_408_within_the_body_timeout_and_frees_its_place(engine, short_wav):
    settings = ServerSettings(served_model_name="tiny.en", body_timeout_s=1.0)
    app = build_app(engine, settings)
    with served(app, settings) as url:
        with slow_uploads(url, 1) as (sock,):
            answer = response_of(sock)  # the server closes the connection after its answer
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408 "), answer
        assert b'"code":"body_timeout"' in body and b"within 1 s" in body
        assert app.state.serving.client_caps.clients.counts == {}
        with http_from(SLOW_PEER) as http:
            assert post_audio(http, url, short_wav).status_code == 200


@contextmanager
def served_by(app, settings: ServerSettings, **config) -> Iterator[tuple[str, uvicorn.Server]]:
    """``app`` under uvicorn as ``oasr serve`` configures it (the request-head deadline, lingering closes), on a
    free port; its URL and the uvicorn server (whose ``server_state`` holds the open connections). ``config``:
    more ``uvicorn.Config`` options."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = {"log_level": "warning", "lifespan": "off", "timeout_graceful_shutdown": 2, **config}
    server = uvicorn.Server(uvicorn_config(app, settings, **config))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="oasr-test-server", daemon=True)
    thread.start()
    wait_until(lambda: server.started, "the server to start")
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", server
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


@contextmanager
def served(app, settings: ServerSettings) -> Iterator[str]:
    """``app`` under uvicorn as ``oasr serve`` configures it, on a free port; its URL."""
    with served_by(app, settings) as (url, _):
        yield url


def test_a_request_cut_by_shutdown_gets_503_with_retry_after_and_its_decode_is_aborted(engine, short_wav):
    slow = SlowEngine(engine)  # 400 tokens a window: still decoding when the 2 s graceful period ends
    settings = ServerSettings(served_model_name="tiny.en")
    answers: list[httpx.Response] = []
    with ExitStack() as stack:
        url = stack.enter_context(served(build_app(slow, settings), settings))
        with httpx.Client(timeout=WAIT_S) as http:
            sender = threading.Thread(target=lambda: answers.append(post_audio(http, url, short_wav)), daemon=True)
            sender.start()
            wait_until(lambda: engine.stats().num_running > 0, "the request to decode")
            stack.close()  # the server shuts down with the request in flight
            sender.join(timeout=WAIT_S)
    assert len(answers) == 1, "the request got no answer"
    assert answers[0].status_code == 503 and answers[0].headers.get("retry-after") == "1", answers[0].text
    assert answers[0].json()["error"]["code"] == "shutting_down"
    wait_until(lambda: slow.num_closed_early == 1, "the engine request to be aborted")
    assert slow.num_finished == 0


HEADS = {
    "nothing sent": b"",
    "head sent slowly": b"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: multi",
    "second head on a kept-alive connection": b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\nGET /heal",
}


@pytest.mark.parametrize("case", list(HEADS))
def test_connection_without_a_whole_request_head_gets_408_and_is_closed(engine, case):
    settings = ServerSettings(served_model_name="tiny.en", header_timeout_s=1.0)
    with served(build_app(engine, settings), settings) as url, \
            socket.create_connection(("127.0.0.1", port_of(url)), timeout=ANSWER_S) as sock:
        sock.sendall(HEADS[case])
        answer = response_of(sock)
    assert answer.count(b"HTTP/1.1 ") == 1 + case.startswith("second")
    assert b"HTTP/1.1 408 Request Timeout" in answer and answer.endswith(b"not received in time.")
    if case.startswith("second"):
        assert answer.startswith(b"HTTP/1.1 200 OK")  # the first request was answered as usual


def test_client_over_its_cap_gets_429_while_another_client_is_served(engine, short_wav):
    settings = ServerSettings(served_model_name="tiny.en", max_in_flight_per_client=2, retry_after_s=7)
    app = CountingApp(build_app(engine, settings))
    with running_server(app) as url, slow_uploads(url, 2):  # uploads in progress count against their client
        wait_until(lambda: app.num_started == 2, "the slow uploads to reach the app")
        with http_from(SLOW_PEER) as http:
            refused = post_audio(http, url, short_wav)
        assert (refused.status_code, refused.headers["retry-after"]) == (429, "7")
        assert refused.json()["error"]["code"] == "client_busy"
        assert "This client already has 2 requests open" in refused.json()["error"]["message"]
        with http_from(OTHER_PEER) as http:
            assert post_audio(http, url, short_wav).status_code == 200


def test_api_key_over_its_cap_gets_429_while_another_key_is_served(engine, short_wav):
    settings = ServerSettings(served_model_name="tiny.en", api_keys=("key-a", "key-b"), max_in_flight_per_key=2,
                              max_in_flight_per_client=None)
    app = CountingApp(build_app(engine, settings))
    with running_server(app) as url, \
            slow_uploads(url, 2, extra_headers="Authorization: Bearer key-a\r\n"):
        wait_until(lambda: app.num_started == 2, "the slow uploads to reach the app")
        with http_from(OTHER_PEER) as http:
            refused = post_audio(http, url, short_wav, Authorization="Bearer key-a")
            assert refused.status_code == 429 and refused.json()["error"]["code"] == "client_busy"
            assert "This API key already has 2 requests open" in refused.json()["error"]["message"]
            assert post_audio(http, url, short_wav, Authorization="Bearer key-b").status_code == 200
            assert post_audio(http, url, short_wav, Authorization="Bearer key-c").status_code == 401


def serve_settings(*argv: str) -> ServerSettings:
    return _serve_settings(build_parser().parse_args(["serve", *argv]))


def test_serve_flags_set_the_keys_caps_and_timeouts(monkeypatch):
    monkeypatch.setenv("OASR_API_KEY", "from-env")
    assert serve_settings().api_keys == ("from-env",)
    settings = serve_settings("--api-key", "a", "--api-key", "b", "--max-queue-per-client", "0",
                              "--max-queue-per-key", "3", "--body-timeout-s", "5", "--header-timeout-s", "2")
    assert settings.api_keys == ("a", "b")
    assert (settings.max_in_flight_per_client, settings.max_in_flight_per_key) == (None, 3)
    assert (settings.body_timeout_s, settings.header_timeout_s) == (5, 2)
    defaults = ServerSettings(served_model_name="m")
    assert (defaults.max_in_flight_per_client, defaults.max_in_flight_per_key) == (64, 128)


# ------------------------------------------------------------------------------------------ response formats


@pytest.fixture(scope="module")
def offline_timestamped(tiny_en):
    return oasr.transcribe(JFK, tiny_en, timestamps=True)[0]


def test_subtitles_and_verbose_json_decode_timestamps_by_default(engine, offline_timestamped):
    expected = offline_timestamped
    assert len(expected.segments) == 2  # tiny.en closes a segment at 8.00 s: one cue per 30 s window would be 1
    with running_server(build_app(engine, ServerSettings(served_model_name="tiny.en"))) as url:
        def answer(fmt: str) -> httpx.Response:
            return httpx.post(f"{url}/v1/audio/transcriptions", files={"file": (JFK.name, JFK.read_bytes())},
                              data={"model": "tiny.en", "response_format": fmt}, timeout=WAIT_S)

        assert answer("srt").text == to_srt(expected)
        assert answer("vtt").text == to_vtt(expected)
        verbose = answer("verbose_json").json()
    assert [(s["start"], s["end"], s["text"].strip()) for s in verbose["segments"]] == [
        (s.start, s.end, s.text) for s in expected.segments]
    for segment in verbose["segments"]:  # measured by the engine over the window, never left null
        assert segment["avg_logprob"] < 0 and 0 <= segment["no_speech_prob"] < 0.6


def test_window_segments_carry_the_engines_measurements(tiny_en):
    """A model without timestamps answers one segment per window; it still carries what the engine measured."""
    tokenizer = tiny_en.tokenizer
    window = decoded_window(tokenizer, 0, 480_000, 11.0, tokenizer.encode(" And so my fellow Americans"), "en",
                            avg_logprob=-0.25, no_speech_prob=0.125)
    (segment,) = verbose_segments(tokenizer, [window], DecodeOptions(timestamps=False))
    assert (segment.start, segment.end, segment.avg_logprob, segment.no_speech_prob) == (0.0, 11.0, -0.25, 0.125)


# ------------------------------------------------------------------------------------------ schema, hosts, CORS


def test_openapi_declares_the_multipart_form_of_each_audio_route(engine):
    with running_server(build_app(engine, ServerSettings(served_model_name="tiny.en"))) as url:
        paths = httpx.get(f"{url}/openapi.json", timeout=WAIT_S).json()["paths"]
    forms = {route: paths[f"/v1/audio/{route}"]["post"]["requestBody"]["content"]["multipart/form-data"]["schema"]
             for route in ("transcriptions", "translations")}
    for form in forms.values():
        assert form["required"] == ["file", "model"]
        assert form["properties"]["file"] == {**form["properties"]["file"], "type": "string", "format": "binary"}
        # diarized_json is declared on both; a translation asking for it is refused at the route (speakers label
        # a transcription), and a server without --diarization-model refuses it with a 400 naming the flag
        assert form["properties"]["response_format"]["enum"] == ["json", "text", "srt", "vtt", "verbose_json",
                                                                 "diarized_json"]
        assert form["properties"]["temperature"] == {**form["properties"]["temperature"], "minimum": 0.0,
                                                     "maximum": 1.0, "type": "number"}
        assert form["properties"]["beam_size"]["type"] == "integer"  # no null branch: a form sends no nulls
    transcription, translation = forms["transcriptions"], forms["translations"]
    assert {"language", "target_language", "stream", "timestamp_granularities[]"} <= set(transcription["properties"])
    assert transcription["properties"]["timestamp_granularities[]"]["items"]["enum"] == ["word", "segment"]
    assert not {"target_language", "stream", "timestamp_granularities[]"} & set(translation["properties"])
    assert "language" in translation["properties"]  # for models that cannot detect it (Canary)


LOOPBACK = ServerSettings(served_model_name="tiny.en", allowed_hosts=LOOPBACK_HOSTS)


@pytest.mark.parametrize("host", ["localhost", "LOCALHOST:8000", "127.0.0.1", "127.0.0.1:1234", "[::1]",
                                  "[::1]:8000"])
def test_loopback_host_names_are_answered_on_any_port(engine, host):
    with running_server(build_app(engine, LOOPBACK)) as url:
        assert httpx.get(f"{url}/health", headers={"Host": host}, timeout=WAIT_S).status_code == 200


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8000", "localhost.evil.example", "127.0.0.2",
                                  "[::2]:8000"])
def test_other_host_names_get_400_saying_why(engine, host):
    with running_server(build_app(engine, LOOPBACK)) as url:
        for path in ("/health", "/v1/models"):
            response = httpx.get(f"{url}{path}", headers={"Host": host}, timeout=WAIT_S)
            assert response.status_code == 400
            error = response.json()["error"]
            assert error["code"] == "invalid_host" and f"Host '{host}' is not served here" in error["message"]
            assert "localhost, 127.0.0.1, ::1" in error["message"]


def test_serve_answers_loopback_names_only_when_listening_on_loopback():
    assert serve_settings().allowed_hosts == LOOPBACK_HOSTS  # the default --host is 127.0.0.1
    assert serve_settings("--host", "::1").allowed_hosts == LOOPBACK_HOSTS
    assert serve_settings("--host", "localhost").allowed_hosts == LOOPBACK_HOSTS
    assert serve_settings("--host", "0.0.0.0").allowed_hosts == ("*",)
    assert serve_settings("--host", "0.0.0.0", "--allowed-hosts", "asr.example",
                          "--allowed-hosts", "*.asr.example").allowed_hosts == ("asr.example", "*.asr.example")


def test_allowed_host_patterns_match_names_and_subdomains():
    middleware = AllowedHostsMiddleware(app=None, allowed=("asr.example", "*.internal.example", "[::1]"))
    assert [middleware.allows(host_name(h)) for h in ("asr.example:443", "a.internal.example", "[::1]:80",
                                                      "internal.example", "asr.example.evil", "x")] == [
        True, True, True, False, False, False]


def test_cors_headers_only_for_the_configured_origins(engine):
    origin = "https://app.example"
    settings = ServerSettings(served_model_name="tiny.en", cors_allow_origins=(origin,))
    preflight = {"Origin": origin, "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization, x-stainless-os"}
    with running_server(build_app(engine, settings)) as url:
        answer = httpx.options(f"{url}/v1/audio/transcriptions", headers=preflight, timeout=WAIT_S)
        assert answer.status_code == 200 and answer.headers["access-control-allow-origin"] == origin
        assert "POST" in answer.headers["access-control-allow-methods"]
        response = httpx.get(f"{url}/v1/models", headers={"Origin": origin}, timeout=WAIT_S)
        assert response.headers["access-control-allow-origin"] == origin
        other = httpx.options(f"{url}/v1/audio/transcriptions", headers={**preflight, "Origin": "https://evil.example"},
                              timeout=WAIT_S)
        assert "access-control-allow-origin" not in other.headers
    with running_server(build_app(engine, ServerSettings(served_model_name="tiny.en"))) as url:  # the default
        response = httpx.get(f"{url}/v1/models", headers={"Origin": origin}, timeout=WAIT_S)
        assert response.status_code == 200 and "access-control-allow-origin" not in response.headers
    assert serve_settings("--cors-allow-origin", origin, "--cors-allow-origin", "*").cors_allow_origins == (origin, "*")


# ------------------------------------------------------------------------------------------ stopping


def _children(pid: int) -> set[int]:
    try:
        return {int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}
    except FileNotFoundError:
        return set()


def _healthy(url: str, server: subprocess.Popen) -> bool:
    assert server.poll() is None, "oasr serve exited before it served"
    try:
        return httpx.get(f"{url}/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def test_sigterm_stops_serve_and_its_engine_core_and_removes_the_core_sockets():
    temp = Path(tempfile.mkdtemp(prefix="oasr-t-"))  # short: an IPC path must fit a Unix socket address
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "oasr.cli", "serve", "--model", "tiny.en", "--device", "cpu", "--dtype",
               "float32", "--port", str(port)]
    server = subprocess.Popen(command, cwd=Path(oasr.__file__).parents[1], env={**os.environ, "TMPDIR": str(temp)},
                              stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: _healthy(f"http://127.0.0.1:{port}", server), "oasr serve to start")
        (sockets,) = temp.glob("oasr-core-*")
        assert {p.name for p in sockets.iterdir()} == {"input", "output"}
        cores = [p for p in _children(server.pid) if b"resource_tracker" not in Path(f"/proc/{p}/cmdline").read_bytes()]
        assert len(cores) == 1  # the engine core (besides multiprocessing's resource tracker)
        server.send_signal(signal.SIGTERM)
        _, errors = server.communicate(timeout=WAIT_S)
        assert server.returncode == 0, errors
        assert "Traceback" not in errors
        assert not sockets.exists(), "the engine core's socket directory was left behind"
        assert not Path(f"/proc/{cores[0]}").exists(), "the engine core outlived the server"
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()
        shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_unwinds_the_serving_block_once_and_ends_there(sig):
    """What ``serve`` runs in: the signal raises in the block, so its cleanup runs; a second signal during
    that cleanup does not cut it short; the block then ends without an error, the handlers restored."""

    def escaped(signum, frame) -> None:  # what a signal getting past the block would reach
        raise AssertionError(f"signal {signum} was not handled by stopped_by_signals")

    previous = signal.signal(sig, escaped)
    steps = []
    try:
        with stopped_by_signals():
            try:
                signal.raise_signal(sig)
                steps.append("not interrupted")
            finally:
                signal.raise_signal(sig)
                steps.append("cleaned up")
        assert signal.getsignal(sig) is escaped
    finally:
        signal.signal(sig, previous)
    assert steps == ["cleaned up"]
