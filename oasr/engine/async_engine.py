"""``AsyncEngine``: the engine loop on its own thread, served to asyncio callers (``oasr serve --engine-mode
thread``; the default runs the engine in a process of its own, ``oasr.engine.core_client``).

The loop thread owns the ``ASREngine`` (nothing else touches it): it takes new requests and aborts from a
queue, runs ``step()`` while there is work, and hands every output to the caller's event loop. Word
alignments (``align_words``) come through the same queue and run between two steps. A model whose capability
record names a streaming runtime gets a ``StreamingEngine`` (whole files through its ``ASREngine``); stream
messages (``open_stream``'s ``LiveStream``) come through the queue too, as the engine core's do. Tensor work
releases the GIL, so request handling on the event loop keeps running while the GPU is busy.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import numpy as np

from oasr.engine.config import EngineConfig
from oasr.engine.core_protocol import OpenStream
from oasr.engine.engine import ASREngine
from oasr.engine.live_stream import LiveStream, stream_error
from oasr.engine.relay import EngineDeadError, EngineOverloadedError, relay, settle
from oasr.engine.stream_router import StreamRouter
from oasr.engine.stats import EngineStats
from oasr.engine.request import RequestOutput
from oasr.transcription.words import align_windows, supports_word_timestamps
from oasr.errors import OASRError
from oasr.models.loader import LoadedModel
from oasr.models.base import AlignmentRow
from oasr.models.capabilities import ModelCapabilities, capabilities_of
from oasr.streaming.engine import StreamingConfig, StreamingEngine
from oasr.streaming.types import StreamOptions
from oasr.types import DecodeOptions, Word


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    partial: bool = True


class AsyncEngine:
    def __init__(self, loaded: LoadedModel, config: EngineConfig | None = None, *, max_waiting: int = 1024,
                 streaming: StreamingConfig | None = None, live_streams: bool = True) -> None:
        # A streaming model's engine holds stream slots unless its owner serves whole requests only (live_streams
        # False: a Ray replica), which then cost no memory.
        streams = live_streams and capabilities_of(type(loaded.model)).streaming is not None
        self.streaming = StreamingEngine(loaded, streaming, config) if streams else None
        self.engine = self.streaming.offline if self.streaming is not None else ASREngine(loaded, config)
        self._router = StreamRouter(self.streaming, loaded.name)
        self._live: dict[str, LiveStream] = {}
        self.loaded = loaded
        self.tokenizer = loaded.tokenizer
        self.max_waiting = max_waiting
        self._inbox: queue.Queue = queue.Queue()
        self._streams: dict[str, _Stream] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._stats = self._read_stats()
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="oasr-engine", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ caller side (event loop)

    async def check(self, options: DecodeOptions) -> None:
        """Raises ``UnsupportedOptionError`` for options the model cannot serve (before anything is queued)."""
        self.engine.runner.check(options)

    @property
    def alive(self) -> bool:
        return self._error is None and self._thread.is_alive()

    @property
    def window_samples(self) -> int:
        return self.engine.runner.window_samples

    @property
    def supports_word_timestamps(self) -> bool:
        return supports_word_timestamps(self.loaded)

    @property
    def capabilities(self) -> ModelCapabilities:
        return self.engine.capabilities

    def stats(self) -> EngineStats:
        return self._stats

    @property
    def num_in_flight(self) -> int:
        return len(self._streams)

    async def generate(self, audio: np.ndarray, options: DecodeOptions, *,
                       partial: bool = True) -> AsyncIterator[RequestOutput]:
        """Yields this request's outputs as its tokens arrive (only the last, with ``finished=True``, unless
        ``partial``). Leaving the iterator early (client gone, cancelled) aborts the request and frees its rows."""
        if self._error is not None:
            raise EngineDeadError(f"engine stopped: {self._error}")
        if len(self._streams) >= self.max_waiting:
            raise EngineOverloadedError(f"{len(self._streams)} requests in flight; try again later")
        self.engine.runner.check(options)
        request_id = f"async-{next(self._ids)}"
        stream = _Stream(asyncio.get_running_loop(), asyncio.Queue(), partial)
        with self._lock:
            self._streams[request_id] = stream
        self._inbox.put(("add", request_id, audio, options))
        finished = False
        try:
            async for item in relay(stream.queue):
                yield item
                finished = item.finished
        finally:
            with self._lock:
                self._streams.pop(request_id, None)
            if not finished:
                self._inbox.put(("abort", request_id))

    def open_stream(self, options: StreamOptions) -> LiveStream:
        """A live stream (the served model must stream); one that cannot open fails at its first event read."""
        if self._error is not None:
            raise EngineDeadError(f"engine stopped: {self._error}")
        stream = LiveStream(f"stream-{next(self._ids)}", self._send_stream, self._forget_stream)
        with self._lock:
            self._live[stream.stream_id] = stream
        self._inbox.put(("stream", OpenStream(stream.stream_id, options), None))
        return stream

    def _send_stream(self, message: object, audio: np.ndarray | None) -> None:
        if self._error is not None:
            raise EngineDeadError(f"engine stopped: {self._error}")
        self._inbox.put(("stream", message, audio))

    def _forget_stream(self, stream_id: str) -> None:
        with self._lock:
            self._live.pop(stream_id, None)

    async def align_words(self, rows: Sequence[AlignmentRow], audio: Sequence[np.ndarray]) -> list[list[Word]]:
        """The words of one input's decoded windows (``oasr.transcription.words``), computed on the loop thread."""
        if self._error is not None:
            raise EngineDeadError(f"engine stopped: {self._error}")
        future = asyncio.get_running_loop().create_future()
        self._inbox.put(("align", rows, audio, asyncio.get_running_loop(), future))
        return await future

    def shutdown(self) -> None:
        self._stop.set()
        self._inbox.put(("stop",))
        self._thread.join(timeout=30)

    # ------------------------------------------------------------------ loop thread

    def _deliver(self, request_id: str, item: RequestOutput | BaseException) -> None:
        with self._lock:
            stream = self._streams.get(request_id)
        if stream is not None and (stream.partial or not isinstance(item, RequestOutput) or item.finished):
            stream.loop.call_soon_threadsafe(stream.queue.put_nowait, item)

    def _deliver_stream(self, stream_id: str, item: object) -> None:
        with self._lock:
            stream = self._live.get(stream_id)
        if stream is not None:
            stream.loop.call_soon_threadsafe(stream.queue.put_nowait, item)

    def _read_stats(self) -> EngineStats:
        return self.streaming.stats() if self.streaming is not None else self.engine.stats()

    def _has_ready_work(self) -> bool:
        return self.streaming.has_ready_work() if self.streaming is not None else self.engine.has_unfinished()

    def _step(self) -> None:
        if self.streaming is None:
            outputs, events = self.engine.step(), []
        else:
            result = self.streaming.step()
            outputs, events = result.outputs, result.events
        for output in outputs:
            self._deliver(output.request_id, output)
        for routed in self._router.route(events).values():
            for event in routed:
                self._deliver_stream(event.stream_id, event)

    def _handle(self, message: tuple) -> None:
        if message[0] == "stream":
            self._router.handle(message[1], message[2], 0)
            for _, failure in self._router.take_failures():
                self._deliver_stream(failure.stream_id, stream_error(failure))
        elif message[0] == "add":
            _, request_id, audio, options = message
            try:
                self.engine.add_request(audio, options, request_id=request_id)
            except OASRError as exc:
                self._deliver(request_id, exc)
        elif message[0] == "abort":
            self.engine.abort(message[1])
        elif message[0] == "align":
            _, rows, audio, loop, future = message
            try:
                result: list[list[Word]] | BaseException = align_windows(self.loaded, rows, audio)
            except Exception as exc:  # it fails alone: one request's words are not worth the engine's life
                result = exc
            loop.call_soon_threadsafe(settle, future, result)

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                block = not self._has_ready_work()
                try:
                    message = self._inbox.get(block=block, timeout=0.5 if block else None)
                    while True:
                        if message[0] == "stop":
                            return
                        self._handle(message)
                        message = self._inbox.get_nowait()
                except queue.Empty:
                    pass
                if self._has_ready_work():
                    self._step()
                self._stats = self._read_stats()
        except BaseException as exc:  # the loop must not die silently: fail every waiting caller
            self._error = exc
            with self._lock:
                ids = list(self._streams)
            for request_id in ids:
                self._deliver(request_id, EngineDeadError(f"engine stopped: {exc}"))
            with self._lock:
                live = list(self._live)
            for stream_id in live:
                self._deliver_stream(stream_id, EngineDeadError(f"engine stopped: {exc}"))
            self._fail_queued_alignments(EngineDeadError(f"engine stopped: {exc}"))

    def _fail_queued_alignments(self, error: EngineDeadError) -> None:
        while True:
            try:
                message = self._inbox.get_nowait()
            except queue.Empty:
                return
            if message[0] == "align":
                _, _, _, loop, future = message
                loop.call_soon_threadsafe(settle, future, error)
