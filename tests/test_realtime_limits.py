"""``/v1/realtime``'s limits against a hostile client: events Python's JSON parser cannot read, commits faster
than turns are transcribed, one client or one key holding every session, and garbage sent to stay past the idle
timeout. One connection's logic runs against a scripted socket and fabricated engine results (the fakes of
``test_realtime_session``); the session caps also run through a real server on loopback, from two addresses."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from dataclasses import replace

import numpy as np
import pytest
import websockets

from oasr.serving.app import build_app
from oasr.serving.protocol import APIError
from oasr.serving.realtime.connection import RealtimeConnection, RealtimeService
from oasr.serving.settings import RealtimeSettings, ServerSettings
from serving_harness import running_server, small_engine, wait_until
from test_realtime_session import FakeServing, ga_update

TURN_BYTES = 4800  # 100 ms of 24 kHz PCM16: 1,600 samples once at 16 kHz
DEEP_JSON = '{"type": "input_audio_buffer.append", "audio": ' + "[" * 5000 + "]" * 5000 + "}"
LONG_INTEGER = '{"type": "input_audio_buffer.commit", "event_id": "evt_int", "n": ' + "7" * 5000 + "}"
WAIT_S = 30


class ScriptedSocket:
    """A WebSocket whose client events the test sends while the session runs (``None`` disconnects)."""

    def __init__(self) -> None:
        self.incoming: asyncio.Queue[str | None] = asyncio.Queue()
        self.sent: list[dict] = []
        self.client = None
        self.closed = False

    def send_event(self, event: dict | str | None) -> None:
        self.incoming.put_nowait(json.dumps(event) if isinstance(event, dict) else event)

    async def receive(self) -> dict:
        text = await self.incoming.get()
        if text is None:
            return {"type": "websocket.disconnect", "code": 1000}
        return {"type": "websocket.receive", "text": text}

    async def send_text(self, text: str) -> None:
        self.sent.append(json.loads(text))

    async def close(self, code: int = 1000) -> None:
        self.closed = True
        self.incoming.put_nowait(None)

    def of_type(self, suffix: str) -> list[dict]:
        return [e for e in self.sent if e["type"].endswith(suffix)]


class GatedServing(FakeServing):
    """Fabricated transcripts that wait until the test opens the gate (the engine slower than the client)."""

    def __init__(self, realtime: RealtimeSettings) -> None:
        super().__init__("ok")
        self.settings = replace(self.settings, realtime=realtime)
        self.gate = asyncio.Event()

    async def transcribe_turn(self, audio, options, hold, on_text, *, words=False):
        await self.gate.wait()
        return await super().transcribe_turn(audio, options, hold, on_text, words=words)


def append(num_bytes: int = TURN_BYTES, level: int = 0) -> dict:
    pcm = np.full(num_bytes // 2, level, dtype="<i2").tobytes()
    return {"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()}


async def until(condition, task: asyncio.Task, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if task.done():
            task.result()
            raise AssertionError("the session ended early")
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.005)


def start(serving: FakeServing) -> tuple[ScriptedSocket, RealtimeConnection]:
    socket = ScriptedSocket()
    return socket, RealtimeConnection(socket, RealtimeService(serving), "ga", None)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------ unreadable JSON

def test_json_too_deep_or_with_a_too_long_integer_gets_an_error_event_and_the_session_goes_on(caplog):
    async def run() -> list[dict]:
        socket, conn = start(FakeServing("ok"))
        task = asyncio.create_task(conn.run())
        for event in (ga_update({"turn_detection": None}), DEEP_JSON, LONG_INTEGER, append(),
                      {"type": "input_audio_buffer.commit"}):
            socket.send_event(event)
        await until(lambda: socket.of_type(".completed"), task)
        socket.send_event(None)
        await asyncio.wait_for(task, WAIT_S)
        return socket.sent

    with caplog.at_level(logging.INFO, logger="oasr.serving.realtime.connection"):
        sent = asyncio.run(run())
    errors = [e["error"] for e in sent if e["type"] == "error"]
    assert [(e["type"], e["code"]) for e in errors] == [("invalid_request_error", "invalid_json")] * 2
    assert "too deeply" in errors[0]["message"] and "number too long" in errors[1]["message"]
    assert errors[1]["event_id"] == "evt_int"  # found in the text, as for an event too large
    assert sent[-1]["type"].endswith(".completed") and sent[-1]["transcript"] == "Hello world."
    refusals = [r for r in caplog.records if "refused an event" in r.getMessage()]
    assert len(refusals) == 2 and all(r.exc_info is None and "\n" not in r.getMessage() for r in refusals)


# ------------------------------------------------------------------------------------ the turn backlog

def test_commits_past_the_pending_turns_are_refused_until_the_backlog_drains():
    serving = GatedServing(RealtimeSettings(max_pending_turns=2))

    async def run() -> ScriptedSocket:
        socket, conn = start(serving)
        task = asyncio.create_task(conn.run())
        socket.send_event(ga_update({"turn_detection": None}))
        for _ in range(3):
            socket.send_event(append())
            socket.send_event({"type": "input_audio_buffer.commit", "event_id": "evt_commit"})
        await until(lambda: socket.of_type("error"), task)
        assert len(socket.of_type(".committed")) == 2 and conn.backlog.num_turns == 2
        assert conn.buffer.num_buffered_samples > 1400  # the refused commit's audio is still there (less the
        # resampler's tail, which the next commit flushes)
        serving.gate.set()
        await until(lambda: len(socket.of_type(".completed")) == 2, task)
        assert conn.backlog.num_turns == conn.backlog.num_samples == 0
        socket.send_event({"type": "input_audio_buffer.commit"})  # the kept buffer, now that the backlog drained
        await until(lambda: len(socket.of_type(".completed")) == 3, task)
        socket.send_event(None)
        await asyncio.wait_for(task, WAIT_S)
        return socket

    socket = asyncio.run(run())
    (error,) = socket.of_type("error")
    assert error["error"]["code"] == "too_many_pending_turns" and error["error"]["event_id"] == "evt_commit"
    assert error["error"]["type"] == "invalid_request_error" and "2 committed turns" in error["error"]["message"]


def test_commits_past_the_pending_audio_are_refused_but_one_long_turn_always_fits():
    serving = GatedServing(RealtimeSettings(max_pending_audio_s=0.15))

    async def run() -> ScriptedSocket:
        socket, conn = start(serving)
        task = asyncio.create_task(conn.run())
        socket.send_event(ga_update({"turn_detection": None}))
        socket.send_event(append(2 * TURN_BYTES))  # 0.2 s, alone over the limit: it fits (one turn always does)
        socket.send_event({"type": "input_audio_buffer.commit"})
        socket.send_event(append())
        socket.send_event({"type": "input_audio_buffer.commit"})
        await until(lambda: socket.of_type("error"), task)
        serving.gate.set()
        await until(lambda: socket.of_type(".completed"), task)
        socket.send_event(None)
        await asyncio.wait_for(task, WAIT_S)
        return socket

    socket = asyncio.run(run())
    assert len(socket.of_type(".committed")) == 1
    (error,) = socket.of_type("error")
    assert error["error"]["code"] == "too_many_pending_turns" and "0.2 s of audio" in error["error"]["message"]


class LoudnessScorer:
    """The VAD detector's stream, fabricated: a 512-sample chunk is speech when it is loud."""

    def __init__(self) -> None:
        self.pending = np.zeros(0, dtype=np.float32)

    def push(self, samples: np.ndarray) -> np.ndarray:
        self.pending = np.concatenate([self.pending, samples])
        num_chunks = len(self.pending) // 512
        chunks, self.pending = self.pending[: num_chunks * 512], self.pending[num_chunks * 512 :]
        return (np.abs(chunks.reshape(num_chunks, 512)).mean(axis=1) > 0.1).astype(np.float32)


def test_turns_the_server_vad_cuts_past_the_backlog_are_dropped_with_an_error_event(monkeypatch):
    """Speech streamed far faster than real time: turn after turn is cut while the engine has answered none."""
    serving = GatedServing(RealtimeSettings(max_pending_turns=3))
    vad = {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 0, "silence_duration_ms": 100}
    speech, silence = append(6 * TURN_BYTES, level=10_000), append(3 * TURN_BYTES)

    async def run() -> tuple[ScriptedSocket, RealtimeConnection]:
        socket, conn = start(serving)
        monkeypatch.setattr(conn.service.detector, "stream", LoudnessScorer)
        task = asyncio.create_task(conn.run())
        socket.send_event(ga_update({"turn_detection": vad}))
        for _ in range(10):
            socket.send_event(speech)
            socket.send_event(silence)
        await until(lambda: len(socket.of_type("speech_stopped")) == 10, task)
        dropped = len(socket.of_type("error"))
        serving.gate.set()
        await until(lambda: len(socket.of_type(".completed")) == 3, task)
        socket.send_event(None)
        await asyncio.wait_for(task, WAIT_S)
        assert dropped == 7
        return socket, conn

    socket, conn = asyncio.run(run())
    errors = socket.of_type("error")
    assert {e["error"]["code"] for e in errors} == {"too_many_pending_turns"}
    assert all("is dropped" in e["error"]["message"] for e in errors)
    assert len(socket.of_type(".committed")) == 3 and conn.backlog.num_turns == 0


# ------------------------------------------------------------------------------------ the idle clock

def test_invalid_events_do_not_keep_a_session_past_the_idle_timeout():
    serving = FakeServing("ok")
    serving.settings = replace(serving.settings, realtime=RealtimeSettings(idle_timeout_s=1.0))

    async def run() -> tuple[ScriptedSocket, float]:
        socket, conn = start(serving)
        task = asyncio.create_task(conn.run())
        began = time.monotonic()
        while not task.done() and time.monotonic() - began < 3.0:  # garbage every 0.3 s for 3 s
            socket.send_event({"type": "input_audio_buffer.bogus"})
            await asyncio.sleep(0.3)
        await asyncio.wait_for(task, WAIT_S)
        return socket, time.monotonic() - began

    socket, lasted_s = asyncio.run(run())
    assert socket.closed and lasted_s < 2.0
    assert socket.sent[-1]["type"] == "error" and socket.sent[-1]["error"]["code"] == "idle_timeout"


def test_valid_events_keep_a_session_open_past_the_idle_timeout():
    serving = FakeServing("ok")
    serving.settings = replace(serving.settings, realtime=RealtimeSettings(idle_timeout_s=1.0))

    async def run() -> ScriptedSocket:
        socket, conn = start(serving)
        task = asyncio.create_task(conn.run())
        for _ in range(8):  # a clear every 0.3 s for 2.4 s
            socket.send_event({"type": "input_audio_buffer.clear"})
            await asyncio.sleep(0.3)
            assert not task.done()
        socket.send_event(None)
        await asyncio.wait_for(task, WAIT_S)
        return socket

    socket = asyncio.run(run())
    assert not socket.closed and len(socket.of_type(".cleared")) == 8


# ------------------------------------------------------------------------------------ sessions per client and key

def test_one_client_or_one_key_cannot_take_every_session():
    serving = FakeServing("ok")
    serving.settings = replace(serving.settings, realtime=RealtimeSettings(
        max_sessions=6, max_sessions_per_client=2, max_sessions_per_key=3))
    service = RealtimeService(serving)  # type: ignore[arg-type]
    held = [service.open_session("10.0.0.1", None) for _ in range(2)]
    with pytest.raises(APIError) as refused:
        service.open_session("10.0.0.1", None)
    assert refused.value.status == 429 and refused.value.code == "too_many_sessions_per_client"
    held.append(service.open_session("10.0.0.2", 0))  # another client is served
    held.append(service.open_session("10.0.0.3", 0))
    held.append(service.open_session("10.0.0.4", 0))
    with pytest.raises(APIError) as refused:
        service.open_session("10.0.0.5", 0)
    assert refused.value.code == "too_many_sessions_per_key"
    held[0].release()
    held[0].release()  # idempotent
    held.append(service.open_session("10.0.0.1", None))  # its place is free again
    held.append(service.open_session("10.0.0.6", None))
    assert service.num_sessions == 6
    with pytest.raises(APIError) as refused:
        service.open_session("10.0.0.7", None)
    assert refused.value.code == "too_many_sessions"
    for place in held:
        place.release()
    assert service.num_sessions == 0 and service.clients.counts == {} and service.keys.counts == {}


@pytest.fixture(scope="module")
def capped_server():
    engine = small_engine("tiny.en")
    settings = ServerSettings(served_model_name="tiny.en", realtime=RealtimeSettings(
        max_sessions=8, max_sessions_per_client=2))
    try:
        with running_server(build_app(engine, settings)) as url:
            yield url.replace("http://", "ws://") + "/v1/realtime?intent=transcription"
    finally:
        engine.shutdown()


def test_a_client_over_its_session_cap_gets_429_while_another_address_is_served(capped_server):
    async def run() -> tuple[int, dict]:
        greedy = [await websockets.connect(capped_server, local_addr=("127.0.0.2", 0)) for _ in range(2)]
        for socket in greedy:
            assert json.loads(await socket.recv())["type"] == "session.created"
        with pytest.raises(websockets.exceptions.InvalidStatus) as refusal:
            await websockets.connect(capped_server, local_addr=("127.0.0.2", 0))
        async with websockets.connect(capped_server, local_addr=("127.0.0.1", 0)) as other:
            assert json.loads(await other.recv())["type"] == "session.created"
        await greedy[0].close()
        await asyncio.sleep(0)
        deadline = time.monotonic() + WAIT_S
        while True:  # its place is freed once the server has seen the close
            try:
                again = await websockets.connect(capped_server, local_addr=("127.0.0.2", 0))
                break
            except websockets.exceptions.InvalidStatus:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
        for socket in (again, greedy[1]):
            await socket.close()
        response = refusal.value.response
        return response.status_code, json.loads(response.body)

    status, body = asyncio.run(run())
    assert status == 429 and body["error"]["code"] == "too_many_sessions_per_client"


def test_serve_flags_set_the_realtime_caps():
    from oasr.cli import _serve_settings, build_parser

    def realtime(*argv: str) -> RealtimeSettings:
        return _serve_settings(build_parser().parse_args(["serve", *argv])).realtime

    assert realtime() == RealtimeSettings()
    assert (RealtimeSettings().max_sessions_per_client, RealtimeSettings().max_sessions_per_key) == (16, 32)
    capped = realtime("--realtime-max-sessions-per-client", "0", "--realtime-max-sessions-per-key", "3",
                      "--realtime-max-pending-turns", "2", "--realtime-max-pending-audio-s", "30")
    assert (capped.max_sessions_per_client, capped.max_sessions_per_key) == (None, 3)
    assert (capped.max_pending_turns, capped.max_pending_audio_s) == (2, 30)
    with pytest.raises(ValueError, match="max_pending_turns"):
        realtime("--realtime-max-pending-turns", "0")
