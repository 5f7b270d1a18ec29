"""One realtime transcription session over an accepted WebSocket: client events in, server events out.

The receive loop decodes audio into the session's ``TurnBuffer`` (scoring it with the VAD when server VAD is on)
and acts on commits, clears and updates. For an offline model, committed turns queue for a worker task that
transcribes them one at a time, in order, through the server's engine client
(``OpenAIServingTranscription.transcribe_turn``, the path uploads take, with its admission). For a model that
streams (its capability record names a streaming runtime) each turn is a live stream in the engine: opened when
the turn's first audio arrives (commit mode) or when the VAD hears speech start, fed as audio arrives, closed at
the commit; its text goes out as deltas while the turn is spoken, and ``completed`` follows the stream's last
event. The turn boundaries are the buffer's either way. A socket that closes cancels the turns' tasks, which
aborts their engine requests and streams. Bad client input is answered with an ``error`` event and the session
goes on: that includes JSON nested too deeply or holding a number too long for Python to read, which is logged in
one line.

Limits (``RealtimeSettings``): committed turns not yet answered are bounded per session (``TurnBacklog``), and
a commit past them gets an error event; the sessions one client or one API key may hold are counted here
(``RealtimeService.open_session``). The idle clock counts valid client events only: an event the session acted
on (an append, commit, clear or update it accepted) resets it, and so does a turn still being answered; an event
answered with an ``error`` (or a binary frame) does not, so sending garbage does not keep a session open.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import re
import secrets
import time
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from starlette.websockets import WebSocket, WebSocketDisconnect

from oasr.hosting.live_stream import LiveStream
from oasr.hosting.relay import EngineDeadError
from oasr.errors import OASRError, UnsupportedOptionError
from oasr.serving.admission import OpenCounts, Ticket, busy
from oasr.serving.decoding import StreamedText
from oasr.serving.diarization_realtime import SessionSpeakers, segment_events
from oasr.serving.protocol import APIError
from oasr.serving.realtime.audio import InputAudio
from oasr.serving.realtime.protocol import (
    ClearedEvent,
    CommittedEvent,
    Dialect,
    DurationUsage,
    ErrorDetail,
    ErrorEvent,
    ProtocolError,
    ServerEvent,
    SessionConfig,
    SessionEvent,
    SpeechStartedEvent,
    SpeechStoppedEvent,
    TranscriptCompletedEvent,
    TranscriptDeltaEvent,
    TranscriptFailedEvent,
    session_object,
    updated_config,
)
from oasr.serving.realtime.session import (
    SAMPLE_RATE,
    BacklogFullError,
    Committed,
    EmptyBufferError,
    SpeechStarted,
    SpeechStopped,
    TurnBacklog,
    TurnBuffer,
)
from oasr.serving.realtime.vad import DetectorHandle, StreamScorer, UnavailableVADError
from oasr.serving.serving import OpenAIServingTranscription, inline_hotwords
from oasr.streaming.types import StreamCapacityError, StreamOptions
from oasr.types import SERVER_HOTWORD_BEAM_SIZE, DecodeOptions

log = logging.getLogger(__name__)
_UPDATES = ("session.update", "transcription_session.update")
# An event too large or unreadable may still name itself near either end; the error then says which it was.
_EVENT_ID = re.compile(r'"event_id"\s*:\s*"([^"\\]{1,128})"')
_PEEK_CHARS = 512



def _peeked_event_id(text: str) -> str | None:
    """The ``event_id`` an event that could not be parsed names near either end, if any."""
    found = _EVENT_ID.search(text[:_PEEK_CHARS]) or _EVENT_ID.search(text[-_PEEK_CHARS:])
    return found.group(1) if found else None


class RealtimeService:
    """What every session of one app shares: the serving logic, the detector, the open sessions (all of them,
    and per client and per API key). Used on the event loop only."""

    def __init__(self, serving: OpenAIServingTranscription) -> None:
        self.serving = serving
        self.settings = serving.settings.realtime
        self.detector = DetectorHandle(self.settings.vad)
        self.num_sessions = 0
        self.clients = OpenCounts(self.settings.max_sessions_per_client)
        self.keys = OpenCounts(self.settings.max_sessions_per_key)

    def open_session(self, client: str, key: int | None) -> Ticket:
        """A session's place, or the 429 ``APIError`` saying which cap is full: the server's, the client's
        (peer address) or the API key's (``key``, its index; None on an open server)."""
        retry_after_s = self.serving.settings.retry_after_s
        if self.num_sessions >= self.settings.max_sessions:
            raise busy(f"The server has its maximum of {self.settings.max_sessions} realtime sessions open; "
                       "retry shortly.", retry_after_s, code="too_many_sessions")
        if self.clients.full(client):
            raise busy(f"This client already has {self.clients.limit} realtime sessions open, the most one client "
                       "may; close one first.", retry_after_s, code="too_many_sessions_per_client")
        if key is not None and self.keys.full(key):
            raise busy(f"This API key already has {self.keys.limit} realtime sessions open, the most one key may; "
                       "close one first.", retry_after_s, code="too_many_sessions_per_key")
        self.num_sessions += 1
        self.clients.add(client)
        if key is not None:
            self.keys.add(key)

        def release() -> None:
            self.num_sessions -= 1
            self.clients.remove(client)
            if key is not None:
                self.keys.remove(key)

        return Ticket(release)


@dataclass(frozen=True)
class QueuedTurn:
    committed: Committed
    options: DecodeOptions
    committed_at: float  # perf_counter


@dataclass
class LiveTurn:
    """A turn of a streaming model, heard as it is spoken: its stream, what the stream has been sent and when it
    arrived (the delta latency's start), and the commit once it comes."""

    item_id: str
    stream: LiveStream
    committed: asyncio.Future  # -> (Committed, commit time), set at the commit
    num_pushed: int = 0  # samples sent to the stream
    pushed_ends: list[int] = field(default_factory=list)  # the stream's length after each push ...
    arrivals: list[float] = field(default_factory=list)  # ... and when that push's audio arrived (perf_counter)
    task: asyncio.Task | None = None

    def push(self, samples: np.ndarray, arrived: float) -> None:
        if not len(samples):
            return
        try:
            self.stream.push(samples)
        except EngineDeadError:  # the stream's reader hears it too, and fails the turn
            return
        self.num_pushed += len(samples)
        self.pushed_ends.append(self.num_pushed)
        self.arrivals.append(arrived)

    def arrival_of(self, end_s: float) -> float:
        """When the audio up to ``end_s`` of the stream had arrived (the last push, for a padded end)."""
        index = bisect_left(self.pushed_ends, round(end_s * SAMPLE_RATE))
        return self.arrivals[min(index, len(self.arrivals) - 1)] if self.arrivals else time.perf_counter()


class _Closed(Exception):
    """The socket is gone (or closed by us); the session ends."""


class RealtimeConnection:
    def __init__(self, websocket: WebSocket, service: RealtimeService, dialect: Dialect, api_key: int | None) -> None:
        self.ws = websocket
        self.service = service
        self.serving = service.serving
        self.dialect = dialect
        self.api_key = api_key
        self.client = websocket.client.host if websocket.client else ""
        self.session_id = f"sess_{secrets.token_hex(12)}"
        self.config = SessionConfig()
        self.buffer = TurnBuffer(int(service.settings.max_buffer_s * SAMPLE_RATE))
        self.audio = InputAudio(self.config.audio_format)
        self.scorer: StreamScorer | None = None
        self.turns: asyncio.Queue[QueuedTurn] = asyncio.Queue()
        self.num_open_turns = 0  # queued or transcribing (or streaming)
        settings = service.settings
        self.backlog = TurnBacklog(settings.max_pending_turns, int(settings.max_pending_audio_s * SAMPLE_RATE))
        self.last_activity = time.monotonic()  # of the last valid client event (see the module's docstring)
        capabilities = self.serving.engine.capabilities
        self.streaming = capabilities is not None and capabilities.streaming is not None
        self.live: LiveTurn | None = None  # the streamed turn being spoken
        self._streamed: list[LiveTurn] = []  # streamed turns not yet answered, in turn order
        self._send_lock = asyncio.Lock()
        # with --diarization-model: each completed item's speaker segments (oasr.serving.diarization_realtime)
        diarization = self.serving.diarization
        self.speakers = SessionSpeakers(diarization) if diarization is not None else None

    # ------------------------------------------------------------------ the session's life

    async def run(self) -> None:
        worker = asyncio.create_task(self._transcribe_turns())
        try:
            try:
                await self._start_vad(self.config)
            except ProtocolError as exc:  # no VAD on this server: the session starts with manual commits
                log.warning("realtime session without server VAD: %s", exc.message)
                self.config = SessionConfig(turn_detection=None)
            await self.send(SessionEvent(type=self._name("created"), session=self._session()))
            while (message := await self._receive()) is not None:
                await self._handle(message)
        except (_Closed, WebSocketDisconnect):
            pass
        finally:
            worker.cancel()
            for live in self._streamed:  # a task cancelled before it ran would not abort its stream itself
                live.stream.abort()
                live.task.cancel()
            await asyncio.gather(worker, *(live.task for live in self._streamed), return_exceptions=True)

    async def _receive(self) -> str | None:
        """The next text frame; None once the client has gone, or sent no valid event for the idle timeout."""
        while True:
            idle_s = self.service.settings.idle_timeout_s
            try:
                message = await asyncio.wait_for(self.ws.receive(),
                                                 max(0.0, self.last_activity + idle_s - time.monotonic()))
            except TimeoutError:
                if self.num_open_turns:  # a turn still being answered: the session is not idle
                    self.last_activity = time.monotonic()
                    continue
                await self.send(ErrorEvent.of(ProtocolError(
                    f"No valid client event for {self.service.settings.idle_timeout_s:g} s; the session is closed.",
                    code="idle_timeout")))
                await self.ws.close(1000)
                return None
            if message["type"] == "websocket.disconnect":
                return None
            if message.get("text") is not None:
                return message["text"]
            await self.send(ErrorEvent.of(ProtocolError("Events are JSON text frames; a binary frame was sent.",
                                                        code="invalid_event")))

    async def send(self, event: ServerEvent) -> None:
        try:
            async with self._send_lock:
                await self.ws.send_text(event.model_dump_json())
        except (WebSocketDisconnect, RuntimeError, OSError) as exc:
            raise _Closed from exc
        except Exception as exc:  # the server library's own "connection closed"
            if type(exc).__name__.startswith("ConnectionClosed"):
                raise _Closed from exc
            raise

    # ------------------------------------------------------------------ client events

    async def _handle(self, text: str) -> None:
        """Acts on one client event, or answers it with an ``error`` event; only an event acted on counts as
        activity for the idle clock."""
        event_id = None
        try:
            limit = self.service.settings.max_event_bytes
            if len(text) > limit or len(text.encode("utf-8", "surrogatepass")) > limit:
                event_id = _peeked_event_id(text)
                raise ProtocolError(f"The event is larger than this server's limit of {limit} bytes; send audio "
                                    "in smaller appends.", code="event_too_large")
            try:
                event = self._parse(text)
            except ProtocolError:
                event_id = _peeked_event_id(text)
                raise
            if not isinstance(event, dict) or not isinstance(event.get("type"), str):
                raise ProtocolError("An event is a JSON object with a string 'type'.", code="invalid_event",
                                    param="type")
            event_id = event.get("event_id") if isinstance(event.get("event_id"), str) else None
            try:
                await self._dispatch(event)
            except RecursionError:  # a value parsed, but too deep for the code that reads it
                self._log_unreadable("a value nested too deeply")
                raise ProtocolError("The event nests its values too deeply.", code="invalid_event") from None
            self.last_activity = time.monotonic()
        except ProtocolError as exc:
            await self.send(ErrorEvent.of(exc, event_id))

    def _parse(self, text: str) -> Any:
        """The event's JSON; raises ``ProtocolError`` for text that is not JSON, or that Python's parser cannot
        read: nesting past the interpreter's recursion limit, or an integer over its digit limit (4,300)."""
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise ProtocolError(f"The event is not valid JSON: {exc.msg}.", code="invalid_json") from None
        except RecursionError:
            self._log_unreadable("JSON nested too deeply")
            raise ProtocolError("The event's JSON nests too deeply to be read.", code="invalid_json") from None
        except ValueError as exc:  # "Exceeds the limit (4300 digits) for integer string conversion ..."
            self._log_unreadable(f"a number too long ({str(exc).partition(':')[0]})")
            raise ProtocolError("The event's JSON holds a number too long to be read.",
                                code="invalid_json") from None

    def _log_unreadable(self, what: str) -> None:
        log.info("realtime session %s (client %s): refused an event holding %s", self.session_id, self.client,
                 what)

    async def _dispatch(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        if kind == "input_audio_buffer.append":
            await self._append(event)
        elif kind == "input_audio_buffer.commit":
            await self._commit()
        elif kind == "input_audio_buffer.clear":
            self.audio.flush()
            self._drop_live()
            self.buffer.clear()
            await self._restart_scorer()
            await self.send(ClearedEvent())
        elif kind in _UPDATES:
            await self._update(event)
        else:
            raise ProtocolError(f"Unknown event type '{kind[:64]}'. This transcription session takes "
                                f"{', '.join(_UPDATES)}, input_audio_buffer.append, .commit and .clear.",
                                code="unknown_event_type", param="type")

    async def _append(self, event: dict[str, Any]) -> None:
        arrived = time.perf_counter()
        encoded = event.get("audio")
        if not isinstance(encoded, str):
            raise ProtocolError("input_audio_buffer.append needs 'audio', a base64 string.", code="invalid_value",
                                param="audio")
        try:
            data = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise ProtocolError("'audio' is not valid base64.", code="invalid_base64", param="audio") from None
        codec = self.audio.codec
        if len(data) % codec.bytes_per_sample:
            raise ProtocolError(f"The session's format is {codec.name}, {codec.bytes_per_sample} bytes per sample; "
                                f"this append holds {len(data)} bytes.", code="invalid_audio_format", param="audio")
        num_samples = len(data) // codec.bytes_per_sample * SAMPLE_RATE // codec.sample_rate
        if self.buffer.num_buffered_samples + num_samples > self.buffer.max_buffer_samples:
            raise ProtocolError(f"The input audio buffer holds at most {self.service.settings.max_buffer_s:g} s of "
                                "audio; commit or clear it first.", code="input_audio_buffer_full", param="audio")
        samples = self.audio.push(data)
        self.serving.metrics.realtime_audio_seconds.inc(len(data) / codec.bytes_per_sample / codec.sample_rate)
        self.buffer.append(samples, bounded=False)  # checked above, before the resampler took the samples
        if self.scorer is not None:
            probs = await asyncio.to_thread(self.scorer.push, samples)
            for found in self.buffer.detect(probs):
                if isinstance(found, SpeechStarted):
                    await self.send(SpeechStartedEvent(item_id=found.item_id, audio_start_ms=found.audio_start_ms))
                    if self.streaming:
                        self._open_live(found.item_id)
                elif isinstance(found, SpeechStopped):
                    await self.send(SpeechStoppedEvent(item_id=found.item_id, audio_end_ms=found.audio_end_ms))
                else:
                    await self._committed(found, arrived)
        if self.streaming:
            self._feed(arrived)

    async def _commit(self) -> None:
        try:  # the whole buffer bounds the turn (with speech open it starts later), the resampler's tail aside
            self.backlog.check(self.buffer.num_buffered_samples)
        except BacklogFullError as exc:
            raise self._backlog_error(exc, "the buffer is kept; commit it") from None
        self.buffer.append(self.audio.flush(), bounded=False)  # the resampler's tail belongs to this turn
        try:
            committed = self.buffer.commit()
        except EmptyBufferError:
            raise ProtocolError("Cannot commit an empty input audio buffer; append audio first.",
                                code="input_audio_buffer_commit_empty") from None
        await self._restart_scorer()
        await self._committed(committed, checked=True)

    async def _committed(self, committed: Committed, arrived: float | None = None, *, checked: bool = False) -> None:
        """``checked``: the backlog was checked before the turn was cut (a client's commit); a turn the server VAD
        cut is checked here, and dropped when it does not fit."""
        if not checked:
            try:
                self.backlog.check(len(committed.audio))
            except BacklogFullError as exc:
                if self.live is not None and self.live.item_id == committed.item_id:
                    self._drop_live()
                await self.send(ErrorEvent.of(self._backlog_error(exc, f"turn {committed.item_id} is dropped")))
                return
        self.backlog.add(len(committed.audio))
        await self.send(CommittedEvent(item_id=committed.item_id, previous_item_id=committed.previous_item_id))
        if self.streaming:
            self._end_live(committed, time.perf_counter() if arrived is None else arrived)
            return
        self.num_open_turns += 1
        self.turns.put_nowait(QueuedTurn(committed, self._options(self.config), time.perf_counter()))

    @staticmethod
    def _backlog_error(exc: BacklogFullError, outcome: str) -> ProtocolError:
        return ProtocolError(f"Too many turns waiting: {exc}; {outcome} again once a transcript has come "
                             "(this server's --realtime-max-pending-turns / --realtime-max-pending-audio-s).",
                             code="too_many_pending_turns")

    async def _update(self, event: dict[str, Any]) -> None:
        config = updated_config(self.config, event)
        param = "session.audio.input.transcription" if event["type"] == "session.update" else \
            "session.input_audio_transcription"
        if config.model is not None and not self.serving.settings.accepts_model(config.model):
            raise ProtocolError(f"The model `{config.model[:128]}` does not exist; this server serves "
                                f"`{self.serving.settings.served_model_name}`.", code="model_not_found",
                                param=f"{param}.model")
        for name in ("language", "prompt"):
            try:
                await self.serving.engine.check(DecodeOptions(**{name: getattr(config, name) or None}))
            except UnsupportedOptionError as exc:
                raise ProtocolError(str(exc), code="unsupported_option", param=f"{param}.{name}") from None
        await self._check_hotwords(config, f"{param}.hotwords")
        if config.turn_detection != self.config.turn_detection:
            await self._start_vad(config)
        if config.audio_format != self.config.audio_format:
            self.buffer.append(self.audio.flush(), bounded=False)
            self.audio = InputAudio(config.audio_format)
        self.config = config
        await self.send(SessionEvent(type=self._name("updated"), session=self._session()))

    # ------------------------------------------------------------------ VAD and turns

    async def _start_vad(self, config: SessionConfig) -> None:
        """Turn detection as ``config`` asks, the detector's stream started afresh; raises ``ProtocolError``
        (the session unchanged) when the server has no VAD to offer."""
        scorer = None
        if config.turn_detection is not None:
            try:
                scorer = await asyncio.to_thread(self.service.detector.stream)
            except UnavailableVADError as exc:
                raise ProtocolError(f"Server VAD is not available: {exc}; set turn_detection to null and commit "
                                    "by hand.", code="unsupported_option", param="turn_detection") from None
        self.scorer = scorer
        self.buffer.set_turn_detection(config.turn_detection)

    async def _restart_scorer(self) -> None:
        """After a commit or clear the buffer's VAD starts again at its end; so does the detector's stream."""
        if self.scorer is not None:
            self.scorer = await asyncio.to_thread(self.service.detector.stream)

    async def _check_hotwords(self, config: SessionConfig, param: str) -> None:
        """Refuses a hotword list that does not parse, or that this model's turns cannot use."""
        try:
            hotwords = inline_hotwords(config.hotwords)
        except ValueError as exc:
            raise ProtocolError(f"{exc}.", code="invalid_value", param=param) from None
        if not hotwords:
            return
        if self.streaming:
            raise ProtocolError("This model streams its turns, decoded greedily: it takes no hotwords.",
                                code="unsupported_option", param=param)
        try:
            await self.serving.engine.check(DecodeOptions(beam_size=self._hotword_beam(), hotwords=hotwords))
        except UnsupportedOptionError as exc:
            raise ProtocolError(str(exc), code="unsupported_option", param=param) from None

    def _options(self, config: SessionConfig) -> DecodeOptions:
        # Hotwords steer a beam search (where the model needs one): a session that sends them has its turns searched
        # (checked in _update).
        hotwords = inline_hotwords(config.hotwords)
        return DecodeOptions(language=config.language or None, prompt=config.prompt or None,
                             beam_size=self._hotword_beam() if hotwords else None, hotwords=hotwords)

    def _hotword_beam(self) -> int | None:
        capabilities = self.serving.engine.capabilities
        # A session has no beam_size of its own; a model whose network takes hotwords decodes them without one.
        return SERVER_HOTWORD_BEAM_SIZE if capabilities is None or capabilities.hotwords_need_beam else None

    # ------------------------------------------------------------------ streamed turns

    def _open_live(self, item_id: str) -> None:
        """Opens the stream of turn ``item_id``; its task sends the deltas, then ``completed``."""
        self._drop_live()
        try:
            stream = self.serving.engine.open_stream(StreamOptions(language=self.config.language or None))
        except EngineDeadError:
            raise ProtocolError("The engine has stopped; this server cannot transcribe.",
                                code="engine_unavailable", type="server_error") from None
        live = LiveTurn(item_id, stream, asyncio.get_running_loop().create_future())
        previous = self._streamed[-1].task if self._streamed else None
        live.task = asyncio.create_task(self._stream_turn(live, previous))
        self.num_open_turns += 1
        live.task.add_done_callback(lambda _: self._answered(live))  # also when cancelled before it ran
        self._streamed.append(live)
        self.live = live

    def _answered(self, live: LiveTurn) -> None:
        self.num_open_turns -= 1
        self._streamed.remove(live)
        if live.committed.done():  # a committed turn leaves the backlog (a dropped one never entered it)
            committed, _ = live.committed.result()
            self.backlog.remove(len(committed.audio))

    def _feed(self, arrived: float) -> None:
        """Sends the live turn the audio buffered since its last push; in commit mode, the first audio of a
        turn opens its stream (and gives the turn its item id)."""
        if self.live is not None and self.live.item_id != self.buffer.open_item_id:
            self._drop_live()  # the buffer's turn changed under it (a new turn detection)
        if self.live is None and self.config.turn_detection is None and self.buffer.num_buffered_samples:
            self._open_live(self.buffer.turn_item_id())
        if self.live is not None:  # with speech open, only what the turn surely holds
            start = self.buffer.turn_start_sample + self.live.num_pushed
            self.live.push(self.buffer.samples_from(start, self.buffer.settled_end), arrived)

    def _end_live(self, committed: Committed, arrived: float) -> None:
        """The turn is committed: its stream gets the rest of its audio and is closed."""
        if self.live is None or self.live.item_id != committed.item_id:
            self._open_live(committed.item_id)  # a turn that was not heard live (a commit of VAD silence)
        live, self.live = self.live, None
        live.push(committed.audio[live.num_pushed :], arrived)
        try:
            live.stream.close()
        except EngineDeadError:
            pass
        live.committed.set_result((committed, time.perf_counter()))

    def _drop_live(self) -> None:
        """Abandons the turn being spoken (cleared, or no longer the buffer's): its stream is aborted."""
        live, self.live = self.live, None
        if live is not None:
            live.stream.abort()
            live.task.cancel()

    async def _stream_turn(self, live: LiveTurn, previous: asyncio.Task | None) -> None:
        text = StreamedText()
        transcript = ""
        failure: OASRError | None = None
        try:
            try:
                async for event in live.stream.events():
                    transcript = event.text.strip()
                    # A two-pass final replaces the transcript; the deltas stay the streamed text's.
                    piece = "" if event.final_model is not None else text.add(event.text, event.closed)
                    if piece:
                        await self.send(TranscriptDeltaEvent(item_id=live.item_id, delta=piece))
                        self.serving.metrics.realtime_delta_seconds.observe(
                            time.perf_counter() - live.arrival_of(event.end_s))
            except OASRError as exc:  # no free stream slot, an option refused, the engine gone
                failure = exc
            committed, committed_at = await live.committed
            if previous is not None:  # completions go out in turn order
                await asyncio.gather(previous, return_exceptions=True)
            if failure is not None:
                await self.send(TranscriptFailedEvent(item_id=live.item_id, error=self._stream_error(failure)))
                return
            transcript = await self.serving.punctuated_text(transcript)  # deltas went out as decoded
            await self._send_speakers(live.item_id, committed.audio, (), transcript)
            await self.send(TranscriptCompletedEvent(item_id=live.item_id, transcript=transcript,
                                                     usage=DurationUsage(seconds=round(committed.duration_s, 3))))
            self.serving.metrics.realtime_completion_seconds.observe(time.perf_counter() - committed_at)
        except _Closed:
            pass
        finally:
            live.stream.abort()  # a no-op for a stream that closed

    @staticmethod
    def _stream_error(exc: OASRError) -> ErrorDetail:
        if isinstance(exc, StreamCapacityError):
            return ErrorDetail(type="server_error", code="too_many_streams",
                               message=f"The engine has no free stream for this turn ({exc}); retry shortly.")
        if isinstance(exc, UnsupportedOptionError):
            return ErrorDetail(type="invalid_request_error", code="unsupported_option", message=str(exc))
        if isinstance(exc, EngineDeadError):
            return ErrorDetail(type="server_error", code="engine_unavailable",
                               message="The engine has stopped; this server cannot transcribe.")
        log.warning("a streamed turn failed: %s", exc)
        return ErrorDetail(type="server_error", code="stream_failed", message=str(exc))

    async def _transcribe_turns(self) -> None:
        while True:
            turn = await self.turns.get()
            try:
                await self._transcribe(turn)
            except _Closed:
                return
            finally:
                self.num_open_turns -= 1
                self.backlog.remove(len(turn.committed.audio))

    async def _transcribe(self, turn: QueuedTurn) -> None:
        item_id = turn.committed.item_id

        async def delta(piece: str) -> None:
            await self.send(TranscriptDeltaEvent(item_id=item_id, delta=piece))

        try:
            hold = self.serving.client_caps.acquire(self.client, self.api_key)
            # with speakers, words are timed (where the model can) so the item splits where the speaker changes
            result = await self.serving.transcribe_turn(turn.committed.audio, turn.options, hold, delta,
                                                        words=self.speakers is not None)
        except APIError as exc:
            await self.send(TranscriptFailedEvent(item_id=item_id, error=ErrorDetail(
                type=exc.type, code=exc.code, message=exc.message, param=exc.param)))
            return
        await self._send_speakers(item_id, turn.committed.audio, result.segments, result.text)
        await self.send(TranscriptCompletedEvent(item_id=item_id, transcript=result.text,
                                                 usage=DurationUsage(seconds=round(turn.committed.duration_s, 3))))
        self.serving.metrics.realtime_completion_seconds.observe(time.perf_counter() - turn.committed_at)

    async def _send_speakers(self, item_id: str, audio: np.ndarray, segments, transcript: str) -> None:
        """The item's speaker segments, before its ``completed`` (a server with a diarization model)."""
        if self.speakers is not None:
            for event in segment_events(item_id, await self.speakers.turns(audio, segments, transcript)):
                await self.send(event)

    # ------------------------------------------------------------------ helpers

    def _name(self, what: Literal["created", "updated"]) -> Any:  # one of SessionEvent's type literals
        return f"transcription_session.{what}" if self.dialect == "beta" else f"session.{what}"

    def _session(self) -> dict[str, Any]:
        return session_object(self.config, self.session_id, self.serving.settings.served_model_name, self.dialect)
