"""``EngineCoreClient``: the engine client of the HTTP layer, backed by an engine core in its own process.

It starts the core (``oasr.engine.core_process``) with multiprocessing's 'spawn' and talks to it over two
ZeroMQ PUSH/PULL sockets on IPC paths in a private temporary directory. Callers on any asyncio event loop
(tests run several servers on one client) send from their loop; one receiver thread reads the core's updates
and hands each loop its outputs in one callback per update. When the core process exits, every waiting
request fails at once with ``EngineDeadError`` and the client reports itself dead.

With several HTTP worker processes (``oasr serve --api-workers N``) the main process starts one core for N
clients (``SharedEngineCore``) and each worker attaches an ``EngineCoreClient`` to its own channel
(``EngineCoreClient.attach``); an attached client prefixes its request ids with its worker id, sees the core's
death by its process id, and leaves stopping the core to the main process.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import multiprocessing
import os
import shutil
import tempfile
import threading
import time
from collections import OrderedDict, defaultdict
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import zmq

from oasr.engine.core_process import run_engine_core
from oasr.engine.core_protocol import (
    UNSUPPORTED_OPTION,
    AbortRequests,
    AddRequest,
    AlignResult,
    AlignWords,
    CheckOptions,
    CoreFailed,
    CoreReady,
    CoreUpdate,
    AbortStreams,
    EngineCoreSpec,
    EngineInfo,
    OpenStream,
    StopCore,
    TokenDelta,
    dumps,
    loads,
)
from oasr.engine.live_stream import LiveStream, stream_error
from oasr.engine.relay import EngineDeadError, EngineOverloadedError, relay, settle
from oasr.engine.stats import EngineStats
from oasr.engine.request import RequestOutput, RequestTimings
from oasr.errors import OASRError, UnsupportedOptionError
from oasr.models.base import AlignmentRow
from oasr.models.capabilities import ModelCapabilities
from oasr.streaming.types import StreamOptions
from oasr.types import DecodeOptions, Word

log = logging.getLogger(__name__)
RECEIVE_POLL_MS = 200  # the receiver thread looks this often whether the client is shutting down
STOP_WAIT_S = 10.0  # a core asked to stop gets this long before it is terminated
_CHECK_CACHE_SIZE = 256  # distinct option sets remembered (clients choose the language string)


class EngineStartupError(OASRError):
    """The engine core could not load its model or start its loop."""


@dataclass(frozen=True)
class CoreChannel:
    """One client's two sockets to a core: the client binds both, the core connects."""

    input_address: str
    output_address: str


class SharedEngineCore:
    """A core process for several clients, owned by the process that starts it (the main ``oasr serve``
    process with ``--api-workers N``): pass ``channels[i]`` and ``pid`` to worker i's ``EngineCoreClient.attach``."""

    def __init__(self, spec: EngineCoreSpec, num_clients: int) -> None:
        if num_clients < 1:
            raise ValueError(f"a shared engine core needs at least one client, got {num_clients}")
        self.spec = spec
        self.directory = tempfile.mkdtemp(prefix="oasr-core-")  # mode 0700: no other user reaches the sockets
        self.channels = tuple(CoreChannel(f"ipc://{self.directory}/input-{i}", f"ipc://{self.directory}/output-{i}")
                              for i in range(num_clients))
        self.process = _spawn_core(spec, self.channels)

    @property
    def pid(self) -> int:
        assert self.process.pid is not None
        return self.process.pid

    def stop(self) -> None:
        """Terminates the core (its clients see it gone and fail what they wait for) and removes its sockets."""
        if self.process.is_alive():
            self.process.terminate()
        _join_or_kill(self.process)
        shutil.rmtree(self.directory, ignore_errors=True)


def _spawn_core(spec: EngineCoreSpec, channels: tuple[CoreChannel, ...]) -> multiprocessing.process.BaseProcess:
    pairs = tuple((c.input_address, c.output_address) for c in channels)
    process = multiprocessing.get_context("spawn").Process(
        target=run_engine_core, args=(spec, pairs), name="oasr-engine-core", daemon=True)
    process.start()
    return process


def _join_or_kill(process: multiprocessing.process.BaseProcess) -> None:
    process.join(timeout=STOP_WAIT_S)
    if process.is_alive():
        log.warning("the engine core did not stop in %g s; terminating it", STOP_WAIT_S)
        process.terminate()
        process.join(timeout=STOP_WAIT_S)
    if process.is_alive():
        process.kill()
        process.join()


def _pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, exited but not yet reaped by its parent, does not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    token_ids: list[int] = field(default_factory=list)

    def apply(self, delta: TokenDelta) -> RequestOutput:
        offset = 0 if delta.finished else len(self.token_ids)  # a finished delta carries every token
        self.token_ids[offset:] = delta.new_token_ids
        return RequestOutput(delta.request_id, list(self.token_ids), delta.language, delta.finished,
                             delta.finish_reason, delta.timings or RequestTimings(queued=0.0),
                             delta.sum_logprob, delta.no_speech_prob)


class EngineCoreClient:
    def __init__(self, spec: EngineCoreSpec, *, max_waiting: int = 1024, startup_timeout_s: float = 1800.0,
                 _shared: tuple[CoreChannel, int, str] | None = None) -> None:
        """Starts a core of its own for ``spec``; ``attach`` instead joins a ``SharedEngineCore``."""
        self.max_waiting = max_waiting
        # An own core: this client starts and stops it. A shared one: (channel, core pid, request-id prefix).
        self._owns_core = _shared is None
        self._directory = tempfile.mkdtemp(prefix="oasr-core-") if _shared is None else None
        self._context = zmq.Context()
        self._to_core = self._context.socket(zmq.PUSH)
        self._to_core.setsockopt(zmq.SNDHWM, 0)  # admission (max_waiting) bounds what is queued
        self._to_core.setsockopt(zmq.LINGER, 0)
        self._from_core = self._context.socket(zmq.PULL)
        self._from_core.setsockopt(zmq.RCVHWM, 0)
        self._from_core.setsockopt(zmq.LINGER, 0)
        if _shared is None:
            channel = CoreChannel(f"ipc://{self._directory}/input", f"ipc://{self._directory}/output")
            self._id_prefix = "core-"
        else:
            channel, core_pid, self._id_prefix = _shared
        self._to_core.bind(channel.input_address)
        self._from_core.bind(channel.output_address)
        self._process = _spawn_core(spec, (channel,)) if _shared is None else None
        self._core_pid = self._process.pid if self._process is not None else core_pid
        try:
            self.info = self._wait_ready(spec, startup_timeout_s)
        except BaseException:
            self._stop_process()
            self._close_sockets()
            raise
        self.tokenizer = self.info.tokenizer
        self._stats = self.info.stats
        self._streams: dict[str, _Stream] = {}
        self._live: dict[str, LiveStream] = {}  # open streams (a streaming model's), by stream id
        # Calls the core answers once (option checks, alignments), by call id.
        self._calls: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Future]] = {}
        self._check_cache: OrderedDict[DecodeOptions, str | None] = OrderedDict()
        self._lock = threading.Lock()  # guards the four above and ``_error``
        self._send_lock = threading.Lock()  # a ZeroMQ socket is used by one thread at a time
        self._ids = itertools.count()
        self._error: str | None = None
        self._closing = threading.Event()
        self._receiver = threading.Thread(target=self._receive_loop, name="oasr-core-receiver", daemon=True)
        self._receiver.start()

    @classmethod
    def attach(cls, spec: EngineCoreSpec, channel: CoreChannel, core_pid: int, worker_id: int, *,
               max_waiting: int = 1024, startup_timeout_s: float = 1800.0) -> EngineCoreClient:
        """A client of a ``SharedEngineCore`` (started elsewhere with ``spec``) on its channel ``channel``;
        its request ids start with ``w<worker_id>-`` so they never collide with another worker's."""
        return cls(spec, max_waiting=max_waiting, startup_timeout_s=startup_timeout_s,
                   _shared=(channel, core_pid, f"w{worker_id}-"))

    # ------------------------------------------------------------------ the engine-client interface

    @property
    def window_samples(self) -> int:
        return self.info.window_samples

    @property
    def alive(self) -> bool:
        return self._error is None and self._core_alive()

    @property
    def pid(self) -> int | None:
        """The engine core's process id."""
        return self._core_pid

    @property
    def num_in_flight(self) -> int:
        return len(self._streams)

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

    async def align_words(self, rows: Sequence[AlignmentRow], audio: Sequence[np.ndarray]) -> list[tuple[Word, ...]]:
        """The words of one input's decoded windows (``oasr.transcription.words``), computed in the core."""
        num_samples = tuple(len(a) for a in audio)
        samples = np.concatenate(audio).astype(np.float32, copy=False) if audio else np.zeros(0, np.float32)
        return await self._call(lambda call_id: AlignWords(call_id, tuple(rows), num_samples), samples)

    async def _call(self, message: Callable[[int], object], audio: np.ndarray | None = None):
        """Sends ``message(call_id)``, which the core answers once, and returns the answer (raises what the
        answer carries, or ``EngineDeadError`` when the core goes away first)."""
        future = asyncio.get_running_loop().create_future()
        with self._lock:
            self._raise_if_dead()
            call_id = next(self._ids)
            self._calls[call_id] = (asyncio.get_running_loop(), future)
        try:
            self._send(message(call_id), audio)
            return await future
        finally:
            with self._lock:
                self._calls.pop(call_id, None)

    async def generate(self, audio: np.ndarray, options: DecodeOptions, *,
                       partial: bool = True) -> AsyncIterator[RequestOutput]:
        """Yields this request's outputs (every new token with ``partial``, else only the last, which has
        ``finished=True``). Leaving the iterator early aborts the request in the core and frees its rows."""
        stream = _Stream(asyncio.get_running_loop(), asyncio.Queue())
        with self._lock:
            self._raise_if_dead()
            if len(self._streams) >= self.max_waiting:
                raise EngineOverloadedError(f"{len(self._streams)} requests in flight; try again later")
            request_id = f"{self._id_prefix}{next(self._ids)}"
            self._streams[request_id] = stream
        finished = False
        try:
            self._send(AddRequest(request_id, options, partial), np.ascontiguousarray(audio, dtype=np.float32))
            async for item in relay(stream.queue):
                yield item
                finished = item.finished
        finally:
            with self._lock:
                self._streams.pop(request_id, None)
            if not finished and self._error is None:
                self._send_if_reachable(AbortRequests((request_id,)))

    def open_stream(self, options: StreamOptions) -> LiveStream:
        """A live stream in the core (the served model must stream: ``capabilities.streaming``). Opening is not
        awaited: a stream the core cannot open (no free slot, say) fails at its first ``events()`` read."""
        with self._lock:
            self._raise_if_dead()
            stream_id = f"{self._id_prefix}stream-{next(self._ids)}"
            stream = LiveStream(stream_id, self._send, self._forget_stream)
            self._live[stream_id] = stream
        try:
            self._send(OpenStream(stream_id, options))
        except EngineDeadError:
            self._forget_stream(stream_id)
            raise
        return stream

    def _forget_stream(self, stream_id: str) -> None:
        with self._lock:
            self._live.pop(stream_id, None)

    def shutdown(self) -> None:
        """Stops the core (asking first, then terminating) and the receiver; waiting requests fail. An attached
        client aborts its own requests instead and leaves the shared core running."""
        if self._closing.is_set():
            return
        self._closing.set()
        if self._core_alive():
            if self._owns_core:
                self._send_if_reachable(StopCore())
            else:
                if self._streams:
                    self._send_if_reachable(AbortRequests(tuple(self._streams)))
                if self._live:
                    self._send_if_reachable(AbortStreams(tuple(self._live)))
        self._stop_process()
        self._receiver.join(timeout=STOP_WAIT_S)  # it wakes every RECEIVE_POLL_MS; a busy machine may be slow
        self._fail_all("the engine core was shut down")
        if self._receiver.is_alive():  # closing sockets under its poll would abort the process: leave them
            log.warning("the engine-core receiver did not stop; leaving its sockets open")
            return
        self._close_sockets()

    # ------------------------------------------------------------------ start and stop

    def _wait_ready(self, spec: EngineCoreSpec, timeout_s: float) -> EngineInfo:
        poller = self._poller()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            events = dict(poller.poll(1000))
            if self._from_core in events:
                message = loads(self._from_core.recv())
                if isinstance(message, CoreReady):
                    return message.info
                if isinstance(message, CoreFailed):
                    raise EngineStartupError(f"the engine could not start {spec.model}: {message.message}")
            elif events or not self._core_alive():
                raise EngineStartupError(f"the engine core {self._exit_description()} while starting {spec.model}")
        raise EngineStartupError(f"the engine core did not start {spec.model} within {timeout_s:g} s")

    def _poller(self) -> zmq.Poller:
        poller = zmq.Poller()
        poller.register(self._from_core, zmq.POLLIN)
        if self._process is not None:
            poller.register(self._process.sentinel, zmq.POLLIN)
        return poller

    def _core_alive(self) -> bool:
        if self._process is not None:
            return self._process.is_alive()
        return self._core_pid is not None and _pid_alive(self._core_pid)

    def _exit_description(self) -> str:
        if self._process is None:
            return f"process {self._core_pid} exited"
        self._process.join(timeout=5)
        return f"exited with code {self._process.exitcode}"

    def _stop_process(self) -> None:
        if self._process is not None:
            _join_or_kill(self._process)

    def _close_sockets(self) -> None:
        self._to_core.close()
        self._from_core.close()
        self._context.term()
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)

    # ------------------------------------------------------------------ sending (any event loop's thread)

    def _send(self, message: object, audio: np.ndarray | None = None) -> None:
        """Sends without ever blocking the caller's event loop: a PUSH socket whose core has gone (no peer left
        on the IPC path) would block forever, so a send that cannot be queued at once means the core is gone.
        A live core never refuses one (the send queue is unbounded)."""
        frames = [dumps(message)] if audio is None else [dumps(message), audio]
        try:
            with self._send_lock:
                self._to_core.send_multipart(frames, flags=zmq.NOBLOCK, copy=audio is None)
        except zmq.Again:
            raise EngineDeadError("engine stopped: the engine core is not reachable") from None

    def _send_if_reachable(self, message: object) -> None:
        """For messages that matter only to a live core (aborts, stop): a gone core needs none."""
        try:
            self._send(message)
        except EngineDeadError:
            pass

    def _raise_if_dead(self) -> None:
        """Fails fast once the core is gone, without waiting for the receiver thread to notice it."""
        if self._error is None and not self._core_alive():
            self._error = f"the engine core {self._exit_description()}"
        if self._error is not None:
            raise EngineDeadError(f"engine stopped: {self._error}")

    # ------------------------------------------------------------------ receiving (the receiver thread)

    def _receive_loop(self) -> None:
        poller = self._poller()
        while not self._closing.is_set():
            events = dict(poller.poll(RECEIVE_POLL_MS))
            if events:
                reason = self._drain()
                if reason is None and self._process is not None and self._process.sentinel in events:
                    reason = f"the engine core process {self._exit_description()}"
            elif self._process is not None or self._core_alive():
                continue
            else:  # a shared core, watched by its process id (its sentinel belongs to the main process)
                reason = f"the engine core {self._exit_description()}"
            if reason is not None:
                if not self._closing.is_set():
                    log.error("engine unavailable: %s", reason)
                self._fail_all(reason)
                return

    def _drain(self) -> str | None:
        """Dispatches every update waiting now; returns why the core stopped if it said so."""
        while True:
            try:
                message = loads(self._from_core.recv(zmq.NOBLOCK))
            except zmq.Again:
                return None
            if isinstance(message, CoreFailed):
                return message.message
            if isinstance(message, CoreUpdate):
                self._dispatch(message)

    def _dispatch(self, update: CoreUpdate) -> None:
        batches: dict[asyncio.AbstractEventLoop, list[tuple[Callable, object]]] = defaultdict(list)
        with self._lock:
            if update.stats is not None:
                self._stats = update.stats
            for delta in update.deltas:
                stream = self._streams.get(delta.request_id)
                if stream is not None:
                    batches[stream.loop].append((stream.queue.put_nowait, stream.apply(delta)))
            for failure in update.failures:
                stream = self._streams.get(failure.request_id)
                if stream is not None:
                    batches[stream.loop].append((stream.queue.put_nowait, _error_of(failure.kind, failure.message)))
            for check in update.checks:
                if check.call_id in self._calls:
                    loop, future = self._calls[check.call_id]
                    batches[loop].append((functools.partial(settle, future), check.error))
            for alignment in update.alignments:
                if alignment.call_id in self._calls:
                    loop, future = self._calls[alignment.call_id]
                    batches[loop].append((functools.partial(settle, future), _words_of(alignment)))
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

    def _fail_all(self, reason: str) -> None:
        batches: dict[asyncio.AbstractEventLoop, list[tuple[Callable, object]]] = defaultdict(list)
        with self._lock:
            self._error = self._error or reason
            for stream in self._streams.values():
                batches[stream.loop].append((stream.queue.put_nowait, EngineDeadError(f"engine stopped: {reason}")))
            for loop, future in self._calls.values():
                batches[loop].append((functools.partial(settle, future), EngineDeadError(f"engine stopped: {reason}")))
            for live in self._live.values():
                batches[live.loop].append((live.queue.put_nowait, EngineDeadError(f"engine stopped: {reason}")))
        for loop, calls in batches.items():
            _call_soon(loop, calls)


def _error_of(kind: str, message: str) -> OASRError:
    return UnsupportedOptionError(message) if kind == UNSUPPORTED_OPTION else OASRError(message)


def _words_of(alignment: AlignResult) -> list[tuple[Word, ...]] | OASRError:
    if alignment.error_kind is not None:
        return _error_of(alignment.error_kind, alignment.error or "word alignment failed")
    return list(alignment.words)


def _run_all(calls: list[tuple[Callable, object]]) -> None:
    for call, value in calls:
        call(value)


def _call_soon(loop: asyncio.AbstractEventLoop, calls: list[tuple[Callable, object]]) -> None:
    try:
        loop.call_soon_threadsafe(_run_all, calls)
    except RuntimeError:  # that loop has closed: its server stopped, nobody is waiting there
        pass
