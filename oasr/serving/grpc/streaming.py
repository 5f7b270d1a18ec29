"""``StreamingRecognize``'s audio after its config: results go out while the audio is still arriving.

Two kinds of stream, as ``/v1/realtime`` has two kinds of turn (and with its pieces, not copies of them):
- ``LiveModelStream``, for a model that streams (its capability record names a runtime): the call's audio is one
  live stream in the engine, opened with endpointing (Riva's ``stop_history`` sets the pause that ends an
  utterance). Each event's text is an interim result; an utterance the endpointer ends, and the last one when the
  client half-closes, is a final result.
- ``TurnStream``, for an offline model: the realtime session's ``TurnBuffer`` cuts turns where the server's VAD
  hears speech stop (Riva's ``stop_history`` as the silence, ``start_threshold`` as the threshold), and each
  turn is decoded as a realtime turn is (``transcribe_turn``, beside the uploads, with their admission): its
  stable text as interim results, its transcript as the final result. Turns are answered in order. Without a
  VAD on the server the whole call is one turn, decoded when the client half-closes.

Both read the client's messages on a task of their own, so results go out while audio comes in. A call that
ends in any way (answered, failed, cancelled by the client) aborts its engine stream or turn, freeing its rows.
A client that sends nothing for the realtime idle timeout is answered DEADLINE_EXCEEDED.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import grpc
import numpy as np

from oasr.errors import OASRError, UnsupportedOptionError
from oasr.hosting.live_stream import LiveStream
from oasr.hosting.relay import EngineDeadError
from oasr.serving.grpc.audio import RawAudio
from oasr.serving.grpc.config import RecognitionRequest, RivaError, invalid
from oasr.serving.grpc.protos import riva_asr_pb2
from oasr.serving.grpc.results import streaming_response
from oasr.serving.realtime.connection import RealtimeService
from oasr.serving.realtime.session import (
    SAMPLE_RATE,
    BacklogFullError,
    Committed,
    TurnBacklog,
    TurnBuffer,
    TurnDetection,
)
from oasr.serving.realtime.vad import StreamScorer, UnavailableVADError
from oasr.streaming.endpointing import EndpointConfig
from oasr.streaming.types import StreamCapacityError, StreamOptions

log = logging.getLogger(__name__)
Response = riva_asr_pb2.StreamingRecognizeResponse
_DONE = object()  # the output queue's end


class RivaStream:
    """What both kinds share: the reader task, the output queue, and how the call's results end."""

    def __init__(self, service: RealtimeService, request: RecognitionRequest, interim: bool) -> None:
        self.service = service
        self.serving = service.serving
        self.request = request
        self.interim = interim
        self.audio = RawAudio(request.audio)
        self.out: asyncio.Queue[Response | BaseException | object] = asyncio.Queue()
        self._tasks: list[asyncio.Task] = []

    async def responses(self, requests: AsyncIterator[riva_asr_pb2.StreamingRecognizeRequest]) -> AsyncIterator[Response]:
        self._spawn(self._read(requests))
        try:
            while (item := await self.out.get()) is not _DONE:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self.stop()
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def _spawn(self, work) -> asyncio.Task:
        task = asyncio.create_task(self._reported(work))
        self._tasks.append(task)
        return task

    async def _reported(self, work) -> None:
        """Runs ``work``; a failure ends the call with its status."""
        try:
            await work
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - handed to the call, which reports it
            self.out.put_nowait(_status_of(exc))

    async def _read(self, requests: AsyncIterator[riva_asr_pb2.StreamingRecognizeRequest]) -> None:
        idle_s = self.service.settings.idle_timeout_s
        iterator = aiter(requests)
        while True:
            try:
                request = await asyncio.wait_for(anext(iterator), idle_s)
            except StopAsyncIteration:
                break
            except TimeoutError:
                raise RivaError(grpc.StatusCode.DEADLINE_EXCEEDED,
                                f"no audio for {idle_s:g} s; the stream is closed") from None
            if request.HasField("streaming_config"):
                raise invalid("streaming_config", "only the first message carries the config; send audio_content")
            if request.audio_content:
                await self.push(self.audio.push(request.audio_content))
        await self.end(self.audio.flush())

    def result(self, text: str, *, final: bool, audio_processed_s: float) -> None:
        if final or self.interim:
            self.out.put_nowait(streaming_response(text, final=final, audio_processed_s=audio_processed_s,
                                                   language_code=self.request.language_code))

    async def push(self, samples: np.ndarray) -> None:
        raise NotImplementedError

    async def end(self, tail: np.ndarray) -> None:
        """The client half-closed; ``tail``: the resampler's last samples."""
        raise NotImplementedError

    def stop(self) -> None:
        """The call is over: engine work still running is aborted."""


class LiveModelStream(RivaStream):
    def __init__(self, service: RealtimeService, request: RecognitionRequest, interim: bool) -> None:
        super().__init__(service, request, interim)
        endpointing = EndpointConfig.from_options(trailing_silence_ms=request.endpointing.stop_history_ms)
        try:
            self.stream: LiveStream = self.serving.engine.open_stream(
                StreamOptions(language=request.options.language, endpointing=endpointing))
        except EngineDeadError:
            raise RivaError(grpc.StatusCode.UNAVAILABLE, "the engine has stopped; this server cannot "
                            "transcribe") from None
        self._spawn(self._results())

    async def push(self, samples: np.ndarray) -> None:
        self.stream.push(samples)

    async def end(self, tail: np.ndarray) -> None:
        self.stream.push(tail)
        self.stream.close()

    def stop(self) -> None:
        self.stream.abort()  # a no-op once the stream has closed

    async def _results(self) -> None:
        finished = -1  # the last utterance given a final result
        last = ""
        async for event in self.stream.events():
            text = event.text.strip()
            if event.final or event.closed:
                if event.utterance > finished and text:
                    self.result(text, final=True, audio_processed_s=event.end_s)
                finished = max(finished, event.utterance)
                last = ""
            elif text and text != last:
                self.result(text, final=False, audio_processed_s=event.end_s)
                last = text
        self.out.put_nowait(_DONE)


class TurnStream(RivaStream):
    def __init__(self, service: RealtimeService, request: RecognitionRequest, interim: bool, client: str,
                 api_key: int | None) -> None:
        super().__init__(service, request, interim)
        settings = service.settings
        self.client = client
        self.api_key = api_key
        self.buffer = TurnBuffer(int(settings.max_buffer_s * SAMPLE_RATE))
        self.backlog = TurnBacklog(settings.max_pending_turns, int(settings.max_pending_audio_s * SAMPLE_RATE))
        self.scorer: StreamScorer | None = None
        self.turns: asyncio.Queue[Committed | None] = asyncio.Queue()
        self._spawn(self._transcribe_turns())

    async def start(self) -> None:
        """Turns cut by the server's VAD, where it has one."""
        given = self.request.endpointing
        defaults = TurnDetection()
        detection = TurnDetection(threshold=given.start_threshold or defaults.threshold,
                                  silence_duration_ms=given.stop_history_ms or defaults.silence_duration_ms)
        try:
            self.scorer = await asyncio.to_thread(self.service.detector.stream)
        except UnavailableVADError as exc:
            log.warning("gRPC stream without VAD turns (the whole stream is one turn): %s", exc)
            return
        self.buffer.set_turn_detection(detection)

    async def push(self, samples: np.ndarray) -> None:
        if self.buffer.num_buffered_samples + len(samples) > self.buffer.max_buffer_samples:
            self._commit(self.buffer.commit())  # a turn as long as the buffer holds is cut there
            if self.scorer is not None:  # the buffer's VAD starts again at its end; so does the detector's stream
                self.scorer = await asyncio.to_thread(self.service.detector.stream)
        self.buffer.append(samples)
        if self.scorer is not None:
            probs = await asyncio.to_thread(self.scorer.push, samples)
            for found in self.buffer.detect(probs):
                if isinstance(found, Committed):
                    self._commit(found)

    async def end(self, tail: np.ndarray) -> None:
        self.buffer.append(tail, bounded=False)
        # With a VAD, audio outside speech is not a turn; without one, everything sent is.
        speaking = self.scorer is None or self.buffer.speech_item_id is not None
        if speaking and self.buffer.num_buffered_samples:
            self._commit(self.buffer.commit())
        self.turns.put_nowait(None)

    def _commit(self, committed: Committed) -> None:
        try:
            self.backlog.check(len(committed.audio))
        except BacklogFullError as exc:
            raise RivaError(grpc.StatusCode.RESOURCE_EXHAUSTED, f"too many turns waiting: {exc}; send audio no "
                            "faster than it is spoken") from None
        self.backlog.add(len(committed.audio))
        self.turns.put_nowait(committed)

    async def _transcribe_turns(self) -> None:
        while (turn := await self.turns.get()) is not None:
            try:
                await self._transcribe(turn)
            finally:
                self.backlog.remove(len(turn.audio))
        self.out.put_nowait(_DONE)

    async def _transcribe(self, turn: Committed) -> None:
        end_s = turn.end_ms / 1000
        text = ""

        async def interim(piece: str) -> None:
            nonlocal text
            text += piece
            if text.strip():
                self.result(text.strip(), final=False, audio_processed_s=end_s)

        hold = self.serving.client_caps.acquire(self.client, self.api_key)
        result = await self.serving.transcribe_turn(turn.audio, self.request.options, hold, interim)
        if result.text:
            self.result(result.text, final=True, audio_processed_s=end_s)


def _status_of(exc: BaseException) -> BaseException:
    """A stream's failure as the call reports it (``RivaError``), or as it was (an unexpected fault)."""
    if isinstance(exc, StreamCapacityError):
        return RivaError(grpc.StatusCode.RESOURCE_EXHAUSTED, f"the engine has no free stream ({exc}); retry shortly")
    if isinstance(exc, UnsupportedOptionError):
        return RivaError(grpc.StatusCode.INVALID_ARGUMENT, f"streaming_config.config: {exc}")
    if isinstance(exc, EngineDeadError):
        return RivaError(grpc.StatusCode.UNAVAILABLE, "the engine has stopped; this server cannot transcribe")
    if isinstance(exc, OASRError) and not isinstance(exc, RivaError):
        return RivaError(grpc.StatusCode.INTERNAL, f"the stream failed: {exc}")
    return exc
