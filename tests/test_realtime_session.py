"""The realtime session's pure logic on CPU, no server: the turn buffer and its server-VAD boundaries on
fabricated speech probabilities, the protocol's session updates, the G.711 tables, and one connection's turn
flow against fabricated engine results (a fake serving logic and a fake socket)."""

from __future__ import annotations

import asyncio
import base64
import json
import warnings
from itertools import count

import numpy as np
import pytest

from oasr.serving.protocol import APIError
from oasr.serving.realtime.audio import InputAudio, codec
from oasr.serving.realtime.protocol import ProtocolError, SessionConfig, updated_config
from oasr.serving.realtime.session import (
    BufferFullError,
    Committed,
    EmptyBufferError,
    SpeechStarted,
    SpeechStopped,
    TurnBuffer,
    TurnDetection,
)

CHUNK = 512
MS_PER_CHUNK = CHUNK / 16  # 32 ms


def item_ids():
    numbers = count(1)
    return lambda: f"item_{next(numbers)}"


def vad_buffer(turn_detection: TurnDetection, max_s: float = 60.0) -> TurnBuffer:
    buffer = TurnBuffer(int(max_s * 16_000), new_item_id=item_ids())
    buffer.set_turn_detection(turn_detection)
    return buffer


def feed(buffer: TurnBuffer, probs: list[float], step: int) -> list:
    """Appends one ramp-valued chunk of samples per probability (sample value = its session index, so a turn's
    samples name where they came from), ``step`` chunks per call; the events of all calls."""
    events = []
    for i in range(0, len(probs), step):
        piece = probs[i : i + step]
        start = buffer._end
        buffer.append(np.arange(start, start + CHUNK * len(piece), dtype=np.float32))
        events.extend(buffer.detect(piece))
    return events


def test_commit_takes_the_whole_buffer_and_chains_item_ids():
    buffer = TurnBuffer(16_000, new_item_id=item_ids())
    buffer.append(np.ones(800, dtype=np.float32))
    first = buffer.commit()
    buffer.append(np.full(1600, 2, dtype=np.float32))
    second = buffer.commit()
    assert (first.item_id, first.previous_item_id, len(first.audio)) == ("item_1", None, 800)
    assert (second.item_id, second.previous_item_id, len(second.audio)) == ("item_2", "item_1", 1600)
    assert (second.start_ms, second.end_ms) == (50, 150) and np.all(second.audio == 2)
    with pytest.raises(EmptyBufferError):
        buffer.commit()


def test_an_append_past_the_buffer_limit_is_refused_and_changes_nothing():
    buffer = TurnBuffer(1000)
    buffer.append(np.zeros(900, dtype=np.float32))
    with pytest.raises(BufferFullError):
        buffer.append(np.zeros(200, dtype=np.float32))
    assert buffer.num_buffered_samples == 900
    buffer.clear()
    buffer.append(np.zeros(1000, dtype=np.float32))


@pytest.mark.parametrize("step", [1, 3, 7, 200])
def test_server_vad_cuts_one_turn_with_openais_start_and_end(step):
    """Speech in chunks 20..39 (640 ms .. 1280 ms); 320 ms of silence ends it; 96 ms of prefix padding."""
    td = TurnDetection(threshold=0.5, prefix_padding_ms=96, silence_duration_ms=320)
    probs = [0.1] * 20 + [0.9] * 20 + [0.05] * 30
    events = feed(vad_buffer(td), probs, step)
    started, stopped, committed = events
    assert started == SpeechStarted("item_1", 640 - 96)
    assert stopped == SpeechStopped("item_1", 1280 + 320)
    assert isinstance(committed, Committed) and committed.item_id == "item_1"
    assert (committed.start_ms, committed.end_ms) == (544, 1600)
    # The turn's samples are exactly the session's samples between its bounds.
    assert np.array_equal(committed.audio, np.arange(544 * 16, 1600 * 16, dtype=np.float32))


def test_server_vad_finds_two_turns_and_numbers_them_in_order():
    td = TurnDetection(prefix_padding_ms=0, silence_duration_ms=160)
    probs = [0.0] * 5 + [1.0] * 10 + [0.0] * 10 + [1.0] * 8 + [0.0] * 6
    events = feed(vad_buffer(td), probs, 1000)
    kinds = [type(e).__name__ for e in events]
    assert kinds == ["SpeechStarted", "SpeechStopped", "Committed"] * 2
    assert [e.audio_start_ms for e in events if isinstance(e, SpeechStarted)] == [5 * 32, 25 * 32]
    assert [e.audio_end_ms for e in events if isinstance(e, SpeechStopped)] == [15 * 32 + 160, 33 * 32 + 160]
    turns = [e for e in events if isinstance(e, Committed)]
    assert [(t.item_id, t.previous_item_id) for t in turns] == [("item_1", None), ("item_2", "item_1")]


def test_probabilities_between_the_two_thresholds_neither_end_speech_nor_count_as_silence():
    """The segmenter's hysteresis: below threshold but above threshold - 0.15 keeps speech open."""
    td = TurnDetection(threshold=0.5, prefix_padding_ms=0, silence_duration_ms=160)
    probs = [0.0] * 2 + [0.9] * 5 + [0.4] * 20 + [0.9] * 2 + [0.0] * 6
    events = feed(vad_buffer(td), probs, 4)
    assert [type(e).__name__ for e in events] == ["SpeechStarted", "SpeechStopped", "Committed"]
    assert events[1].audio_end_ms == 29 * 32 + 160


def test_speech_still_open_stays_in_the_buffer_and_silence_is_dropped_down_to_the_prefix():
    td = TurnDetection(prefix_padding_ms=64, silence_duration_ms=500)
    buffer = vad_buffer(td)
    assert feed(buffer, [0.0] * 100, 10) == []
    assert buffer.num_buffered_samples == 64 * 16  # an idle session keeps only the prefix padding
    events = feed(buffer, [1.0] * 50, 10)
    assert events == [SpeechStarted("item_1", 100 * 32 - 64)]
    assert buffer.speech_item_id == "item_1"
    assert buffer.num_buffered_samples == 64 * 16 + 50 * CHUNK


def test_a_commit_during_speech_keeps_the_open_item_and_restarts_the_vad():
    td = TurnDetection(prefix_padding_ms=0, silence_duration_ms=100)
    buffer = vad_buffer(td)
    feed(buffer, [0.0] * 3 + [1.0] * 5, 8)
    committed = buffer.commit()
    assert committed.item_id == "item_1" and buffer.speech_item_id is None
    # The detector starts again at the buffer's end: the next speech is a new item.
    events = feed(buffer, [1.0] * 2 + [0.0] * 5, 7)
    assert [type(e).__name__ for e in events] == ["SpeechStarted", "SpeechStopped", "Committed"]
    assert events[0] == SpeechStarted("item_2", 8 * 32)


@pytest.mark.parametrize("step", [1, 3])
def test_what_an_open_turn_has_settled_is_always_a_prefix_of_the_turn_it_becomes(step):
    """A live stream is fed ``samples_from(turn_start_sample, settled_end)`` as audio arrives; the turn the VAD
    then cuts starts with every piece fed, so the stream hears exactly the committed samples. 300 ms of
    silence is not a whole number of chunks: the turn ends inside the chunk before the one that closes it."""
    td = TurnDetection(threshold=0.5, prefix_padding_ms=96, silence_duration_ms=300)
    buffer = vad_buffer(td)
    probs = [0.1] * 20 + [0.9] * 20 + [0.05] * 30
    settled, events = [], []
    for i in range(0, len(probs), step):
        events += feed(buffer, probs[i : i + step], step)
        if buffer.speech_item_id is not None:
            settled.append(buffer.samples_from(buffer.turn_start_sample, buffer.settled_end))
    committed = next(e for e in events if isinstance(e, Committed))
    assert settled and len(settled[-1]) > len(committed.audio) - (step + 2) * CHUNK  # it kept up
    assert all(np.array_equal(committed.audio[: len(piece)], piece) for piece in settled)


def test_a_commit_mode_turn_has_its_item_id_from_its_first_audio_and_a_commit_in_speech_cuts_from_it():
    buffer = TurnBuffer(16_000, new_item_id=item_ids())
    buffer.append(np.ones(800, dtype=np.float32))
    early = buffer.turn_item_id()
    assert buffer.open_item_id == early == buffer.turn_item_id() and buffer.settled_end == 800
    assert buffer.commit().item_id == early and buffer.open_item_id is None
    td = TurnDetection(prefix_padding_ms=0, silence_duration_ms=100)
    buffer = vad_buffer(td)
    feed(buffer, [0.0] * 3 + [1.0] * 5, 8)  # three chunks of silence stay buffered, speech opens after them
    assert buffer.num_buffered_samples == 8 * CHUNK and buffer.turn_start_sample == 3 * CHUNK
    committed = buffer.commit()
    assert committed.start_ms == 3 * 32 and np.array_equal(committed.audio, np.arange(3 * CHUNK, 8 * CHUNK))


def test_turn_detection_validates_openais_knobs():
    with pytest.raises(ValueError):
        TurnDetection(threshold=0)
    with pytest.raises(ValueError):
        TurnDetection(silence_duration_ms=0)
    with pytest.raises(ValueError):
        TurnDetection(prefix_padding_ms=-1)


# ------------------------------------------------------------------------------------ protocol

def ga_update(audio_input: dict) -> dict:
    return {"type": "session.update", "session": {"type": "transcription", "audio": {"input": audio_input}}}


def test_ga_update_is_partial_and_null_turn_detection_turns_vad_off():
    config = updated_config(SessionConfig(), ga_update({"transcription": {"language": "en"}}))
    assert config.language == "en" and config.turn_detection == TurnDetection()
    config = updated_config(config, ga_update({"format": {"type": "audio/pcmu"}, "turn_detection": None}))
    assert (config.audio_format, config.turn_detection, config.language) == ("g711_ulaw", None, "en")
    config = updated_config(config, ga_update({"turn_detection": {"type": "server_vad", "threshold": 0.7}}))
    assert config.turn_detection == TurnDetection(threshold=0.7)


def test_beta_update_reads_the_flat_session():
    event = {"type": "transcription_session.update",
             "session": {"input_audio_format": "g711_alaw", "input_audio_transcription": {"prompt": "Hi"},
                         "turn_detection": {"type": "server_vad", "silence_duration_ms": 800}}}
    config = updated_config(SessionConfig(), event)
    assert (config.audio_format, config.prompt) == ("g711_alaw", "Hi")
    assert config.turn_detection == TurnDetection(silence_duration_ms=800)


@pytest.mark.parametrize("event, param", [
    (ga_update({"format": {"type": "audio/pcm", "rate": 16000}}), "session.audio.input.format.rate"),
    (ga_update({"format": {"type": "audio/opus"}}), "session.audio.input.format.type"),
    (ga_update({"turn_detection": {"type": "semantic_vad"}}), "session.audio.input.turn_detection.type"),
    (ga_update({"turn_detection": {"type": "server_vad", "threshold": 2}}),
     "session.audio.input.turn_detection.threshold"),
    ({"type": "transcription_session.update", "session": {"input_audio_format": "pcm32"}},
     "session.input_audio_format"),
    ({"type": "session.update", "session": {"type": "realtime"}}, "session.type"),
])
def test_updates_the_server_cannot_serve_name_the_field(event, param):
    with pytest.raises(ProtocolError) as error:
        updated_config(SessionConfig(), event)
    assert error.value.param == param


# ------------------------------------------------------------------------------------ audio

def test_g711_tables_match_the_standard():
    ulaw, alaw = codec("g711_ulaw").table * 32768, codec("g711_alaw").table * 32768
    assert (ulaw[0x00], ulaw[0x7F], ulaw[0x80], ulaw[0xFF]) == (-32124, 0, 32124, 0)
    assert (alaw[0x55], alaw[0xD5], alaw[0x2A], alaw[0xAA]) == (-8, 8, -32256, 32256)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        audioop = pytest.importorskip("audioop")  # gone in 3.13; where it exists, it must agree
    every_byte = bytes(range(256))
    assert np.array_equal(np.frombuffer(audioop.ulaw2lin(every_byte, 2), "<i2"), ulaw)
    assert np.array_equal(np.frombuffer(audioop.alaw2lin(every_byte, 2), "<i2"), alaw)


def test_input_audio_resamples_24k_pcm16_as_one_pass_would():
    soxr = pytest.importorskip("soxr")
    samples = (np.random.default_rng(0).standard_normal(24_000) * 3000).astype("<i2")
    data = samples.tobytes()
    audio = InputAudio("pcm16")
    pieces = [audio.push(data[i : i + 962]) for i in range(0, len(data), 962)] + [audio.flush()]
    whole = soxr.resample(samples.astype(np.float32) / 32768, 24_000, 16_000)
    assert np.array_equal(np.concatenate(pieces), whole) and audio.input_seconds == 1.0


# ------------------------------------------------------------------------------------ one connection

class FakeSocket:
    """A WebSocket that plays the client's events, then waits (``hold``) or disconnects."""

    def __init__(self, events: list[dict], hold: asyncio.Event | None = None) -> None:
        self.incoming = [json.dumps(e) for e in events]
        self.sent: list[dict] = []
        self.client = None
        self.hold = hold

    async def receive(self) -> dict:
        if self.incoming:
            return {"type": "websocket.receive", "text": self.incoming.pop(0)}
        if self.hold is not None:
            await self.hold.wait()
        return {"type": "websocket.disconnect", "code": 1000}

    async def send_text(self, text: str) -> None:
        self.sent.append(json.loads(text))

    async def close(self, code: int = 1000) -> None:
        pass


class FakeServing:
    """Fabricated engine results: each turn's transcript in two deltas, or an error, or never finishing."""

    def __init__(self, outcome: str) -> None:
        from oasr.serving.admission import ClientCaps
        from oasr.serving.settings import ServerSettings

        self.settings = ServerSettings(served_model_name="fake")
        self.client_caps = ClientCaps(None, None, 1)
        self.outcome = outcome
        self.num_cancelled = 0
        self.started = asyncio.Event()
        self.diarization = None  # no --diarization-model: turns carry no speakers

        class Metrics:
            def __getattr__(self, name):
                return type("M", (), {"inc": lambda *a: None, "observe": lambda *a: None})()

        self.metrics = Metrics()

        class Engine:
            capabilities = None  # an offline model's turns go through transcribe_turn

            async def check(self, options) -> None:  # every option served
                pass

        self.engine = Engine()

    async def punctuated_text(self, text: str) -> str:  # no --punctuate: a completed transcript as decoded
        return text

    async def transcribe_turn(self, audio, options, hold, on_text, *, words=False):
        self.started.set()
        try:
            if self.outcome == "busy":
                raise APIError(429, "busy", type="rate_limit_error", code="server_busy")
            if self.outcome == "hang":
                await asyncio.Event().wait()
            await on_text("Hello")
            await on_text(" world.")
            return type("T", (), {"text": "Hello world.", "segments": ()})()
        except asyncio.CancelledError:
            self.num_cancelled += 1
            raise
        finally:
            hold.release()


async def until(condition, task: asyncio.Task, timeout_s: float = 30.0) -> None:
    """Waits for ``condition``; a session that ended first (it raised) fails the test with its error."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        if task.done():
            task.result()
            raise AssertionError("the session ended early")
        if loop.time() > deadline:
            raise AssertionError("timed out")
        await asyncio.sleep(0.01)


def connection(socket: FakeSocket, serving: FakeServing):
    from oasr.serving.realtime.connection import RealtimeConnection, RealtimeService

    service = RealtimeService(serving)  # type: ignore[arg-type]
    return RealtimeConnection(socket, service, "ga", None)  # type: ignore[arg-type]


def manual_turn_events(num_bytes: int = 4800) -> list[dict]:
    audio = base64.b64encode(bytes(num_bytes)).decode()
    return [ga_update({"turn_detection": None}), {"type": "input_audio_buffer.append", "audio": audio},
            {"type": "input_audio_buffer.commit"}]


def played_until_completed(events: list[dict], serving: FakeServing) -> list[dict]:
    """The events a session sent for the client ``events``, once a turn's ``completed`` is among them."""
    hold = asyncio.Event()

    async def run():
        socket = FakeSocket(events, hold)
        task = asyncio.create_task(connection(socket, serving).run())
        await until(lambda: any(e["type"].endswith("completed") for e in socket.sent), task)
        hold.set()
        await task
        return socket.sent

    return asyncio.run(run())


def test_a_committed_turn_is_answered_with_its_deltas_then_completed():
    serving = FakeServing("ok")
    sent = played_until_completed(manual_turn_events(), serving)
    kinds = [e["type"] for e in sent]
    assert kinds == ["session.created", "session.updated", "input_audio_buffer.committed",
                     *["conversation.item.input_audio_transcription.delta"] * 2,
                     "conversation.item.input_audio_transcription.completed"]
    item_id = sent[2]["item_id"]
    assert [e["delta"] for e in sent[3:5]] == ["Hello", " world."]
    assert sent[5]["item_id"] == item_id and sent[5]["transcript"] == "Hello world."
    assert sent[5]["usage"] == {"type": "duration", "seconds": 0.1}  # 4800 bytes: 2400 samples at 24 kHz


def test_a_turn_the_engine_refuses_is_answered_with_failed_and_the_session_goes_on():
    serving = FakeServing("busy")
    hold = asyncio.Event()

    async def run():
        socket = FakeSocket(manual_turn_events() + [{"type": "input_audio_buffer.commit"}], hold)
        task = asyncio.create_task(connection(socket, serving).run())
        await until(lambda: any(e["type"].endswith("failed") for e in socket.sent) and len(socket.sent) >= 5, task)
        hold.set()
        await task
        return socket.sent

    sent = asyncio.run(run())
    failed = next(e for e in sent if e["type"].endswith("failed"))
    assert failed["error"]["code"] == "server_busy" and failed["item_id"] == sent[2]["item_id"]
    error = next(e for e in sent if e["type"] == "error")  # the second commit: nothing buffered
    assert error["error"]["code"] == "input_audio_buffer_commit_empty"


def test_a_dropped_socket_cancels_its_turn_in_flight():
    serving = FakeServing("hang")

    async def run():
        hold = asyncio.Event()
        socket = FakeSocket(manual_turn_events(), hold)
        task = asyncio.create_task(connection(socket, serving).run())
        await serving.started.wait()
        hold.set()  # the client goes away while its turn is being transcribed
        await asyncio.wait_for(task, 10)

    asyncio.run(run())
    assert serving.num_cancelled == 1


def test_without_the_vad_package_sessions_open_in_commit_mode_and_turning_vad_on_is_an_error(monkeypatch):
    """No ``silero-vad`` installed: the session opens with manual commits (``turn_detection`` null), asking for
    server VAD gets an ``error`` event naming the field, and a committed turn is still transcribed."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "silero_vad" else real(name, *a))
    audio = base64.b64encode(bytes(4800)).decode()
    events = [ga_update({"turn_detection": {"type": "server_vad"}}),
              {"type": "input_audio_buffer.append", "audio": audio}, {"type": "input_audio_buffer.commit"}]
    sent = played_until_completed(events, FakeServing("ok"))
    assert sent[0]["type"] == "session.created"
    assert sent[0]["session"]["audio"]["input"]["turn_detection"] is None
    assert sent[1]["type"] == "error" and sent[1]["error"]["param"] == "turn_detection"
    assert "pip install silero-vad" in sent[1]["error"]["message"]
    assert sent[-1]["transcript"] == "Hello world."


def test_the_host_check_refuses_a_socket_for_another_host_before_it_opens():
    """A page that rebinds its DNS name to 127.0.0.1 opens its socket with its own name in Host."""
    from oasr.serving.hosts import AllowedHostsMiddleware

    reached = []

    async def app(scope, receive, send):
        reached.append(scope["type"])

    async def call(host: bytes) -> list[dict]:
        sent = []

        async def send(message):
            sent.append(message)

        scope = {"type": "websocket", "path": "/v1/realtime", "headers": [(b"host", host)]}
        await AllowedHostsMiddleware(app, ("localhost", "127.0.0.1"))(scope, None, send)
        return sent

    assert asyncio.run(call(b"127.0.0.1:8000")) == [] and reached == ["websocket"]
    refused = asyncio.run(call(b"attacker.example:8000"))
    assert [m["type"] for m in refused] == ["websocket.close"] and reached == ["websocket"]


# ------------------------------------------------------------------------------------ streamed turns

class FakeStreams:
    """A streaming engine's client, fabricated: each push decides one more word of its stream's text (the
    whole text so far in every event, as the engine sends it); the close adds a full stop and ends it. With
    ``full``, every stream fails as the engine fails one it has no slot for."""

    capabilities = type("Capabilities", (), {"streaming": "cache_aware"})()

    def __init__(self, full: bool = False) -> None:
        self.full = full
        self.streams: dict[str, object] = {}
        self.words: dict[str, list[str]] = {}
        self.sent: list[tuple[str, str]] = []  # (message kind, stream id)

    async def check(self, options) -> None:
        pass

    def open_stream(self, options):
        from oasr.hosting.live_stream import LiveStream
        from oasr.streaming.types import StreamCapacityError

        stream = LiveStream(f"s{len(self.streams)}", self._send, lambda stream_id: None)
        self.streams[stream.stream_id], self.words[stream.stream_id] = stream, []
        if self.full:
            stream.queue.put_nowait(StreamCapacityError("all 1 stream slots are taken"))
        return stream

    def _send(self, message, audio) -> None:
        from oasr.streaming.types import StreamEvent

        kind, stream_id = type(message).__name__, getattr(message, "stream_id", None) or message.stream_ids[0]
        self.sent.append((kind, stream_id))
        words = self.words[stream_id]
        if kind == "PushAudio":
            words.append(f" w{len(words)}")
        elif kind == "CloseStream":
            words.append(".")
        else:
            return
        closed = kind == "CloseStream"
        event = StreamEvent(stream_id, 0, (), (), "".join(words), 0.0, 0.1, final=closed, closed=closed)
        self.streams[stream_id].queue.put_nowait(event)


def append_event(num_bytes: int = 4800) -> dict:
    return {"type": "input_audio_buffer.append", "audio": base64.b64encode(bytes(num_bytes)).decode()}


def streamed_session(engine: FakeStreams, events: list[dict], done) -> list[dict]:
    """The events sent until ``done(sent)``, then the client leaves; the session must leave no turn open."""
    serving = FakeServing("ok")
    serving.engine = engine

    async def run():
        hold = asyncio.Event()
        socket = FakeSocket(events, hold)
        session = connection(socket, serving)
        task = asyncio.create_task(session.run())
        await until(lambda: done(socket.sent), task)
        hold.set()
        await task
        assert session.num_open_turns == 0 and session._streamed == []
        return socket.sent

    return asyncio.run(run())


def test_a_streamed_turn_sends_deltas_for_its_item_before_the_commit_then_completed():
    engine = FakeStreams()
    events = [ga_update({"turn_detection": None}), append_event(), append_event(),
              {"type": "input_audio_buffer.commit"}]
    sent = streamed_session(engine, events, lambda sent: any(e["type"].endswith("completed") for e in sent))
    kinds = [e["type"] for e in sent]
    committed = sent[kinds.index("input_audio_buffer.committed")]
    deltas = [e for e in sent if e["type"].endswith(".delta")]
    assert kinds.index("conversation.item.input_audio_transcription.delta") < kinds.index(committed["type"])
    assert {e["item_id"] for e in deltas} == {committed["item_id"]}
    completed = sent[-1]
    assert completed["type"].endswith("completed") and completed["item_id"] == committed["item_id"]
    assert "".join(e["delta"] for e in deltas) == completed["transcript"] == "w0 w1 w2."
    assert [k for k, _ in engine.sent] == ["PushAudio", "PushAudio", "PushAudio", "CloseStream"]  # + the tail


def test_a_streamed_turn_without_a_free_stream_fails_after_its_commit_and_a_clear_aborts_a_stream():
    engine = FakeStreams(full=True)
    events = [ga_update({"turn_detection": None}), append_event(), {"type": "input_audio_buffer.commit"}]
    sent = streamed_session(engine, events, lambda sent: any(e["type"].endswith("failed") for e in sent))
    kinds = [e["type"] for e in sent]
    assert kinds[-2:] == ["input_audio_buffer.committed", "conversation.item.input_audio_transcription.failed"]
    assert sent[-1]["error"]["code"] == "too_many_streams" and "slots are taken" in sent[-1]["error"]["message"]

    engine = FakeStreams()
    events = [ga_update({"turn_detection": None}), append_event(), {"type": "input_audio_buffer.clear"}]
    sent = streamed_session(engine, events, lambda sent: any(e["type"].endswith("cleared") for e in sent))
    assert engine.sent[-1] == ("AbortStreams", "s0")
    assert not any(e["type"].endswith(("completed", "failed")) for e in sent)
