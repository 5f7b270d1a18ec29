"""``CoreClient``: the engine-client interface (``oasr.hosting.engine_client``) over any transport to one engine
core. Torch-free: the server's API processes hold these.

Callers on any asyncio event loop (tests run several servers on one client) send from their loop; the transport
hands every ``CoreUpdate`` to ``dispatch`` (on a thread of its own, or the core's thread in-process), which hands
each loop its outputs in one callback per update. When the core goes away, ``fail_all`` fails every waiting
request, call and stream at once, and the client reads as not alive until ``restarted`` is called with the
new core's info (a supervised core, a restarted Ray replica).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import threading
from collections import OrderedDict, defaultdict
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np

from oasr.diarization.types import SpeakerSegment
from oasr.engine.request import BULK_PRIORITY, RequestOutput, RequestTimings
from oasr.engine.stats import EngineStats
from oasr.errors import OASRError, UnsupportedOptionError
from oasr.hosting.live_stream import LiveStream, stream_error
from oasr.hosting.protocol import (
    UNSUPPORTED_OPTION,
    AbortRequests,
    AddRequest,
    AlignResult,
    AlignWords,
    CheckOptions,
    CheckResult,
    CoreUpdate,
    Diarize,
    DiarizeResult,
    EngineInfo,
    OpenStream,
    TokenDelta,
)
from oasr.hosting.relay import EngineDeadError, EngineOverloadedError, relay, settle
from oasr.models.capabilities import ModelCapabilities
from oasr.streaming.types import StreamOptions
from oasr.types import DecodeOptions, Word

_CHECK_CACHE_SIZE = 256  # distinct option sets remembered (clients choose the language string)
CoreState = Literal["starting", "ok", "dead"]


class Transport(Protocol):
    """How messages reach one core. ``send`` never blocks the caller's event loop; it raises ``EngineDeadError``
    when the core cannot be reached."""

    def send(self, message: object, audio: np.ndarray | None = None) -> None: ...

    def core_alive(self) -> bool: ...

    def describe_exit(self) -> str: ...


@dataclass
class _Request:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    token_ids: list[int] = field(default_factory=list)

    def apply(self, delta: TokenDelta) -> RequestOutput:
        offset = 0 if delta.finished else len(self.token_ids)  # a finished delta carries every token
        self.token_ids[offset:] = delta.new_token_ids
        return RequestOutput(delta.request_id, list(self.token_ids), delta.language, delta.finished,
                             delta.finish_reason, delta.timings or RequestTimings(queued=0.0),
                             delta.sum_logprob, delta.no_speech_prob)


class CoreClient:
    def __init__(self, info: EngineInfo, transport: Transport, *, max_waiting: int = 1024,
                 id_prefix: str = "core-") -> None:
        self.info = info
        self.tokenizer = info.tokenizer
        self.transport = transport
        self.max_waiting = max_waiting
        self._id_prefix = id_prefix
        self._stats = info.stats
        self._requests: dict[str, _Request] = {}
        self._live: dict[str, LiveStream] = {}  # open streams (a streaming model's), by stream id
        # Calls the core answers once (option checks, alignments), by call id.
        self._calls: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Future]] = {}
        self._check_cache: OrderedDict[DecodeOptions, str | None] = OrderedDict()
        self._lock = threading.Lock()  # guards the four above, ``_error`` and ``_state``
        self._ids = itertools.count()
        self._error: str | None = None
        self._state: CoreState = "ok"
        self.num_restarts = 0  # cores that came back after the one before died

    # ------------------------------------------------------------------ the engine-client interface

    @property
    def window_samples(self) -> int:
        return self.info.window_samples

    @property
    def state(self) -> CoreState:
        """``ok`` while the core serves; ``starting`` while a new one loads after the last died; ``dead``."""
        if self._state == "ok" and not self.transport.core_alive():
            return "dead"
        return self._state

    @property
    def alive(self) -> bool:
        return self.state == "ok"

    @property
    def num_in_flight(self) -> int:
        return len(self._requests)

    @property
    def supports_word_timestamps(self) -> bool:
        return self.info.supports_word_timestamps

    @property
    def capabilities(self) -> ModelCapabilities:
        return self.info.capabilities

    def stats(self) -> EngineStats:
        return self._stats

    async def check(self, options: DecodeOptions) -> None:
        """Asks the core (once per distinct option set) whether the model serves ``options``."""
        with self._lock:
            known = options in self._check_cache
            error = self._check_cache.get(options)
        if not known:
            error = await self._call(lambda call_id: CheckOptions(call_id, options))
            with self._lock:
                self._check_cache[options] = error
                while len(self._check_cache) > _CHECK_CACHE_SIZE:
                    self._check_cache.popitem(last=False)
        if error is not None:
            raise UnsupportedOptionError(error)

    async def align_words(self, rows: Sequence, audio: Sequence[np.ndarray]) -> list[tuple[Word, ...]]:
        """The words of one input's decoded windows (``oasr.transcription.words``), computed in the core."""
        num_samples = tuple(len(a) for a in audio)
        samples = np.concatenate(audio).astype(np.float32, copy=False) if audio else np.zeros(0, np.float32)
        return await self._call(lambda call_id: AlignWords(call_id, tuple(rows), num_samples), samples)

    @property
    def diarization_model(self) -> str | None:
        return self.info.diarization_model

    async def diarize(self, audio: np.ndarray, threshold: float = 0.5) -> tuple[SpeakerSegment, ...]:
        """Who speaks when in ``audio`` (16 kHz), by the core's diarization model, batched with others there."""
        samples = np.ascontiguousarray(audio, dtype=np.float32)
        return await self._call(lambda call_id: Diarize(call_id, threshold), samples)

    async def _call(self, message: Callable[[int], object], audio: np.ndarray | None = None):
        """Sends ``message(call_id)``, which the core answers once, and returns the answer (raises what the
        answer carries, or ``EngineDeadError`` when the core goes away first)."""
        future = asyncio.get_running_loop().create_future()
        with self._lock:
            self._raise_if_dead()
            call_id = next(self._ids)
            self._calls[call_id] = (asyncio.get_running_loop(), future)
        try:
            self.transport.send(message(call_id), audio)
            return await future
        finally:
            with self._lock:
                self._calls.pop(call_id, None)

    async def generate(self, audio: np.ndarray, options: DecodeOptions, *, partial: bool = True,
                       priority: int = BULK_PRIORITY) -> AsyncIterator[RequestOutput]:
        """Yields this request's outputs (every new token with ``partial``, else only the last, which has
        ``finished=True``); ``priority`` is its place in the core's scheduler (lower sooner). Leaving the
        iterator early aborts the request in the core and frees its rows."""
        request = _Request(asyncio.get_running_loop(), asyncio.Queue())
        with self._lock:
            self._raise_if_dead()
            if len(self._requests) >= self.max_waiting:
                raise EngineOverloadedError(f"{len(self._requests)} requests in flight; try again later")
            request_id = f"{self._id_prefix}{next(self._ids)}"
            self._requests[request_id] = request
        finished = False
        try:
            self.transport.send(AddRequest(request_id, options, partial, priority),
                                np.ascontiguousarray(audio, dtype=np.float32))
            async for item in relay(request.queue):
                yield item
                finished = item.finished
        finally:
            with self._lock:
                self._requests.pop(request_id, None)
            if not finished and self._error is None:
                self.send_if_reachable(AbortRequests((request_id,)))

    def open_stream(self, options: StreamOptions) -> LiveStream:
        """A live stream in the core (the served model must stream: ``capabilities.streaming``). Opening is not
        awaited: a stream the core cannot open (no free slot, say) fails at its first ``events()`` read."""
        with self._lock:
            self._raise_if_dead()
            stream_id = f"{self._id_prefix}stream-{next(self._ids)}"
            stream = LiveStream(stream_id, self.transport.send, self._forget_stream)
            self._live[stream_id] = stream
        try:
            self.transport.send(OpenStream(stream_id, options))
        except EngineDeadError:
            self._forget_stream(stream_id)
            raise
        return stream

    def _forget_stream(self, stream_id: str) -> None:
        with self._lock:
            self._live.pop(stream_id, None)

    def own_ids(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The requests and streams this client has open in the core."""
        with self._lock:
            return tuple(self._requests), tuple(self._live)

    def send_if_reachable(self, message: object) -> None:
        """For messages that matter only to a live core (aborts, stop): a gone core needs none."""
        try:
            self.transport.send(message)
        except EngineDeadError:
            pass

    def _raise_if_dead(self) -> None:
        """Fails fast once the core is gone, without waiting for the transport to notice it."""
        if self._state == "starting":
            raise EngineDeadError("engine restarting: the engine core stopped and a new one is loading the model")
        if self._error is None and not self.transport.core_alive():
            self._error = f"the engine core {self.transport.describe_exit()}"
            self._state = "dead"
        if self._error is not None:
            raise EngineDeadError(f"engine stopped: {self._error}")

    # ------------------------------------------------------------------ the transport's side

    def dispatch(self, update: CoreUpdate) -> None:
        """Hands an update's news to the event loops waiting for them."""
        batches: dict[asyncio.AbstractEventLoop, list[tuple[Callable, object]]] = defaultdict(list)
        with self._lock:
            if update.stats is not None:
                self._stats = update.stats
            for delta in update.deltas:
                request = self._requests.get(delta.request_id)
                if request is not None:
                    batches[request.loop].append((request.queue.put_nowait, request.apply(delta)))
            for failure in update.failures:
                request = self._requests.get(failure.request_id)
                if request is not None:
                    batches[request.loop].append((request.queue.put_nowait,
                                                  error_of(failure.kind, failure.message)))
            for answer in (*update.checks, *update.alignments, *update.diarizations):
                if answer.call_id in self._calls:
                    loop, future = self._calls[answer.call_id]
                    batches[loop].append((functools.partial(settle, future), _value_of(answer)))
            for event in update.stream_events:
                live = self._live.get(event.stream_id)
                if live is not None:
                    batches[live.loop].append((live.queue.put_nowait, event))
            for failure in update.stream_failures:
                live = self._live.get(failure.stream_id)
                if live is not None:
                    batches[live.loop].append((live.queue.put_nowait, stream_error(failure)))
        for loop, calls in batches.items():
            _call_soon(loop, calls)

    def fail_all(self, reason: str, error: type[OASRError] = EngineDeadError, *, restarting: bool = False) -> None:
        """The core is gone: every waiting request, call and stream fails with ``error``. ``restarting``: a new
        core is on its way (``restarted`` brings the client back)."""
        batches: dict[asyncio.AbstractEventLoop, list[tuple[Callable, object]]] = defaultdict(list)
        with self._lock:
            self._error = self._error or reason
            self._state = "starting" if restarting else "dead"
            for request in self._requests.values():
                batches[request.loop].append((request.queue.put_nowait, error(f"engine stopped: {reason}")))
            for loop, future in self._calls.values():
                batches[loop].append((functools.partial(settle, future), error(f"engine stopped: {reason}")))
            for live in self._live.values():
                batches[live.loop].append((live.queue.put_nowait, error(f"engine stopped: {reason}")))
            self._requests.clear()
            self._calls.clear()
            self._live.clear()
        for loop, calls in batches.items():
            _call_soon(loop, calls)

    def restarted(self, info: EngineInfo) -> None:
        """A new core serves (after ``fail_all(..., restarting=True)``): its numbers start from nothing."""
        with self._lock:
            self.info = info
            self._stats = info.stats
            self._check_cache.clear()
            self._error = None
            self._state = "ok"
            self.num_restarts += 1


def error_of(kind: str, message: str) -> OASRError:
    return UnsupportedOptionError(message) if kind == UNSUPPORTED_OPTION else OASRError(message)


def _value_of(answer: CheckResult | AlignResult | DiarizeResult) -> object:
    if isinstance(answer, AlignResult):
        return _words_of(answer)
    if isinstance(answer, DiarizeResult):
        if answer.error_kind is not None:
            return error_of(answer.error_kind, answer.error or "diarization failed")
        return answer.segments
    return answer.error


def _words_of(alignment: AlignResult) -> list[tuple[Word, ...]] | OASRError:
    if alignment.error_kind is not None:
        return error_of(alignment.error_kind, alignment.error or "word alignment failed")
    return list(alignment.words)


def _run_all(calls: list[tuple[Callable, object]]) -> None:
    for call, value in calls:
        call(value)


def _call_soon(loop: asyncio.AbstractEventLoop, calls: list[tuple[Callable, object]]) -> None:
    try:
        loop.call_soon_threadsafe(_run_all, calls)
    except RuntimeError:  # that loop has closed: its server stopped, nobody is waiting there
        pass
