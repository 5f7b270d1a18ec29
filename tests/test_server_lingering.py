"""How ``oasr serve`` closes a connection it answered while the client may still be sending (a 408 for a body
too slow, a refused head): it stops sending, drops what still comes for at most ``CLOSE_LINGER_S``, then closes,
so the client reads its answer and a clean close instead of a reset. Kept-alive clients and idle connections
close as before, and a lingering connection holds a graceful shutdown no longer than the linger.

The first test drives uvicorn's protocol in process with a recording transport: it fails at once if uvicorn
stops closing through the protocol's transport, or renames what ``HeadTimeoutProtocol`` reads of it."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from contextlib import ExitStack

import pytest
import websockets
from uvicorn import Config
from uvicorn.server import ServerState

from oasr.serving.app import build_app
from oasr.serving.connections import CLOSE_LINGER_S, HeadTimeoutProtocol
from oasr.serving.settings import ServerSettings
from serving_harness import small_engine, wait_until
from test_server_hardening import ANSWER_S, port_of, served_by, slow_upload_head, slow_uploads

NUM_SENDS_AFTER = 8  # bytes sent after the answer: on a server that closed at once, the first draws a reset
SEND_EVERY_S = 0.05  # NUM_SENDS_AFTER of these stay well inside the linger
BODY_TIMEOUT = ServerSettings(served_model_name="tiny.en", body_timeout_s=1.0)


@pytest.fixture(scope="module")
def engine():
    engine = small_engine("tiny.en", mode="thread")  # nothing here decodes: only the 408 for a slow body
    yield engine
    engine.shutdown()


# ------------------------------------------------------------------------------------------ uvicorn's seam


class RecordingTransport(asyncio.Transport):
    """A socket transport that records what the protocol does to it."""

    def __init__(self) -> None:
        super().__init__()
        self.written = b""
        self.calls: list[str] = []

    def write(self, data) -> None:
        self.written += bytes(data)

    def write_eof(self) -> None:
        self.calls.append("write_eof")

    def can_write_eof(self) -> bool:
        return True

    def close(self) -> None:
        self.calls.append("close")

    def is_closing(self) -> bool:
        return "close" in self.calls

    def pause_reading(self) -> None:
        self.calls.append("pause_reading")

    def resume_reading(self) -> None:
        self.calls.append("resume_reading")

    def get_extra_info(self, name, default=None):
        return default


async def _answer_at_once(scope, receive, send) -> None:
    """Answers without reading the body, closing the connection when the request asks for it (``/close``)."""
    closing = [(b"connection", b"close")] if scope["path"] == "/close" else []
    await send({"type": "http.response.start", "status": 408, "headers": [(b"content-length", b"2"), *closing]})
    await send({"type": "http.response.body", "body": b"no"})


def _exchange(request: bytes, then: bytes = b"", linger_s: float = 0.2) -> list[list[str]]:
    """``request`` fed to a ``HeadTimeoutProtocol`` over a recording transport, then ``then`` once the answer
    is out; the transport's calls after the answer, after ``then`` and after ``linger_s`` more."""

    async def run() -> list[list[str]]:
        config = Config(_answer_at_once, lifespan="off", log_config=None)
        protocol = HeadTimeoutProtocol(config=config, server_state=ServerState(), app_state={},
                                       _loop=asyncio.get_running_loop(), head_timeout_s=30,
                                       max_head_bytes=1 << 16, linger_s=linger_s)
        transport = RecordingTransport()
        protocol.connection_made(transport)
        protocol.data_received(request)
        while not transport.written.endswith(b"no"):
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.01)  # the task that sent the answer has returned
        seen = [list(transport.calls)]
        written = len(transport.written)
        if then:
            protocol.data_received(then)
        seen.append(list(transport.calls))
        await asyncio.sleep(linger_s + 0.1)
        seen.append(list(transport.calls))
        assert len(transport.written) == written, "the server wrote after its answer"
        return seen

    return asyncio.run(run())


def test_uvicorns_close_after_an_answer_lingers_while_the_body_is_still_coming():
    # More of the body than uvicorn buffers for an app that does not read it: flow control pauses reading.
    partial = b"POST /close HTTP/1.1\r\nHost: x\r\nContent-Length: 1048576\r\n\r\n" + b"a" * (100 << 10)
    answered, after_more, after_linger = _exchange(partial, then=b"d" * 50)
    assert "write_eof" in answered and "close" not in answered  # the FIN, then reading on
    assert "pause_reading" in answered and answered[-1] == "resume_reading"  # read to be dropped, paused or not
    assert "close" not in after_more  # the bytes that came after are dropped (no parse, no new answer)
    assert after_linger[-1] == "close"  # closed by the linger's deadline


def test_uvicorns_close_after_a_whole_request_is_at_once_and_a_kept_alive_connection_stays():
    whole = b"POST /close HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"
    answered, _, _ = _exchange(whole)
    assert answered == ["close"]  # nothing of the client's is left to read: no linger
    _, _, after = _exchange(whole.replace(b"/close", b"/keep"))
    assert "close" not in after and "write_eof" not in after


# ------------------------------------------------------------------------------------------ over sockets


def answer_on(sock: socket.socket) -> bytes:
    """One whole answer (its head and the Content-Length bytes of its body), without waiting for a close."""
    received = b""
    while b"\r\n\r\n" not in received:
        received += _more(sock, received)
    head, _, body = received.partition(b"\r\n\r\n")
    lengths = [line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")]
    while len(body) < int(lengths[0]):
        body += _more(sock, body)
    return head + b"\r\n\r\n" + body


def _more(sock: socket.socket, received: bytes) -> bytes:
    chunk = sock.recv(65536)
    assert chunk, f"the server closed the connection within its answer: {received!r}"
    return chunk


def test_a_client_still_sending_after_its_408_reads_the_answer_and_a_clean_close(engine):
    with served_by(build_app(engine, BODY_TIMEOUT), BODY_TIMEOUT) as (url, _), slow_uploads(url, 1) as (sock,):
        answer = answer_on(sock)  # while the upload trickles on
        assert answer.startswith(b"HTTP/1.1 408 ") and b"connection: close" in answer.lower(), answer
        assert b'"code":"body_timeout"' in answer
        for _ in range(NUM_SENDS_AFTER):  # a client that has not read its answer yet goes on sending
            sock.sendall(b"x" * 1024)
            time.sleep(SEND_EVERY_S)
        assert sock.recv(65536) == b""  # the server's FIN, not a reset


def test_a_client_that_closes_after_its_408_ends_the_linger_at_once(engine):
    with served_by(build_app(engine, BODY_TIMEOUT), BODY_TIMEOUT) as (url, server):
        with socket.create_connection(("127.0.0.1", port_of(url)), timeout=ANSWER_S) as sock:
            sock.sendall(slow_upload_head())
            assert answer_on(sock).startswith(b"HTTP/1.1 408 ")
            assert sock.recv(1) == b""
        closed = time.monotonic()
        wait_until(lambda: not server.server_state.connections, "the server to close the connection")
        assert time.monotonic() - closed < CLOSE_LINGER_S / 2


def test_a_client_that_never_stops_sending_is_cut_off_after_the_linger(engine):
    with served_by(build_app(engine, BODY_TIMEOUT), BODY_TIMEOUT) as (url, server), \
            slow_uploads(url, 1) as (sock,):
        answer_on(sock)
        answered = time.monotonic()
        with pytest.raises((BrokenPipeError, ConnectionResetError)):
            while time.monotonic() - answered < ANSWER_S:
                sock.sendall(b"x" * 1024)
                time.sleep(SEND_EVERY_S)
        cut_off = time.monotonic() - answered
        assert CLOSE_LINGER_S / 2 < cut_off < CLOSE_LINGER_S + 1, cut_off
        assert not server.server_state.connections


def test_a_lingering_connection_holds_a_graceful_shutdown_no_longer_than_the_linger(engine):
    with ExitStack() as uploads:  # they trickle on through the shutdown
        # A graceful period far past the linger: only the linger's deadline may end the wait for the connection.
        with served_by(build_app(engine, BODY_TIMEOUT), BODY_TIMEOUT, timeout_graceful_shutdown=30) as (url, _):
            (sock,) = uploads.enter_context(slow_uploads(url, 1))
            answer_on(sock)
            stopping = time.monotonic()
        assert time.monotonic() - stopping < CLOSE_LINGER_S + 1


def test_a_kept_alive_client_is_answered_on_one_connection_and_an_idle_one_is_closed_at_once(engine):
    request = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    with served_by(build_app(engine, BODY_TIMEOUT), BODY_TIMEOUT, timeout_keep_alive=1) as (url, server), \
            socket.create_connection(("127.0.0.1", port_of(url)), timeout=ANSWER_S) as sock:
        for _ in range(3):
            sock.sendall(request)
            assert answer_on(sock).startswith(b"HTTP/1.1 200 OK")
        assert sock.recv(1) == b""  # the keep-alive timeout's close, as uvicorn's own
        wait_until(lambda: not server.server_state.connections, "the idle connection to close",
                   timeout_s=CLOSE_LINGER_S / 2)  # closed, not lingering: the client has not closed its end


def test_a_realtime_session_opens_and_closes_as_before(engine):
    """A websocket takes its connection over from the HTTP protocol, its transport and its closes with it."""

    async def first_event(url: str) -> str:
        async with websockets.connect(url.replace("http://", "ws://") + "/v1/realtime?intent=transcription") as ws:
            return json.loads(await ws.recv())["type"]

    with served_by(build_app(engine, BODY_TIMEOUT), BODY_TIMEOUT) as (url, server):
        assert asyncio.run(first_event(url)) == "session.created"
        wait_until(lambda: not server.server_state.connections, "the session's connection to close",
                   timeout_s=CLOSE_LINGER_S / 2)
