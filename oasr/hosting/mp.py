"""The engine core in a process of its own, reached over ZeroMQ (``oasr serve``'s default), and supervised.

``MPClient`` starts the core (``oasr.hosting.process``) with multiprocessing's 'spawn' and talks to it over two
PUSH/PULL sockets on IPC paths in a private temporary directory; it is a ``CoreClient``, so the HTTP layer sees
the same engine client as in-process. One receiver thread reads the core's updates and watches the process: when
the core dies, every waiting request fails at once with ``EngineDeadError`` (503), the client reads ``starting``
and a new core is started after a back-off (``oasr.hosting.supervisor``); once it says ``CoreReady`` the client
serves again, with the new core's numbers.

With several HTTP worker processes (``oasr serve --api-workers N``) the main process starts one core for N
clients (``SharedEngineCore``, which supervises it the same way) and each worker attaches an ``MPClient`` to its
own channel (``MPClient.attach``); an attached client prefixes its request ids with its worker id, sees the core's
death by its process id, waits for the next core's ``CoreReady`` on its channel, and leaves stopping the core to
the main process.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass

import numpy as np
import zmq

from oasr.errors import OASRError
from oasr.hosting.client import CoreClient
from oasr.hosting.process import run_engine_core
from oasr.hosting.protocol import (
    AbortRequests,
    AbortStreams,
    CoreFailed,
    CoreReady,
    CoreUpdate,
    EngineCoreSpec,
    EngineInfo,
    StopCore,
    dumps,
    loads,
)
from oasr.hosting.relay import EngineDeadError
from oasr.hosting.supervisor import RestartBudget, RestartPolicy

log = logging.getLogger(__name__)
RECEIVE_POLL_MS = 200  # the receiver thread looks this often whether the client is shutting down
STOP_WAIT_S = 10.0  # a core asked to stop gets this long before it is terminated


class EngineStartupError(OASRError):
    """The engine core could not load its model or start its loop."""


@dataclass(frozen=True)
class CoreChannel:
    """One client's two sockets to a core: the client binds both, the core connects."""

    input_address: str
    output_address: str


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


class SharedEngineCore:
    """A core process for several clients, owned by the process that starts it (the main ``oasr serve``
    process with ``--api-workers N``): pass ``channels[i]`` and ``pid`` to worker i's ``MPClient.attach``. A
    thread starts the core again when it dies (the workers' clients wait for its ``CoreReady``)."""

    def __init__(self, spec: EngineCoreSpec, num_clients: int, policy: RestartPolicy = RestartPolicy()) -> None:
        if num_clients < 1:
            raise ValueError(f"a shared engine core needs at least one client, got {num_clients}")
        self.spec = spec
        self.directory = tempfile.mkdtemp(prefix="oasr-core-")  # mode 0700: no other user reaches the sockets
        self.channels = tuple(CoreChannel(f"ipc://{self.directory}/input-{i}", f"ipc://{self.directory}/output-{i}")
                              for i in range(num_clients))
        self.process = _spawn_core(spec, self.channels)
        self.budget = RestartBudget(policy)
        self._stopping = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="oasr-core-supervisor", daemon=True)
        self._watcher.start()

    @property
    def pid(self) -> int:
        assert self.process.pid is not None
        return self.process.pid

    def _watch(self) -> None:
        while not self._stopping.is_set():
            multiprocessing.connection.wait([self.process.sentinel], timeout=RECEIVE_POLL_MS / 1000)
            if self.process.is_alive() or self._stopping.is_set():
                continue
            self.process.join()
            delay = self.budget.died()
            if delay is None:
                log.error("the engine core died (exit code %s) too often; it stays down", self.process.exitcode)
                return
            log.error("the engine core died (exit code %s); starting a new one in %.1f s", self.process.exitcode,
                      delay)
            if self._stopping.wait(delay):
                return
            self.process = _spawn_core(self.spec, self.channels)
            self.budget.started()

    def stop(self) -> None:
        """Terminates the core (its clients see it gone and fail what they wait for) and removes its sockets."""
        self._stopping.set()
        self._watcher.join(timeout=STOP_WAIT_S)
        if self.process.is_alive():
            self.process.terminate()
        _join_or_kill(self.process)
        shutil.rmtree(self.directory, ignore_errors=True)


class _Sockets:
    """A client's end of one channel, and the ``Transport`` its ``CoreClient`` sends through."""

    def __init__(self, channel: CoreChannel, core_pid: int | None) -> None:
        self.context = zmq.Context()
        self.to_core = self.context.socket(zmq.PUSH)
        self.to_core.setsockopt(zmq.SNDHWM, 0)  # admission (max_waiting) bounds what is queued
        self.to_core.setsockopt(zmq.LINGER, 0)
        self.from_core = self.context.socket(zmq.PULL)
        self.from_core.setsockopt(zmq.RCVHWM, 0)
        self.from_core.setsockopt(zmq.LINGER, 0)
        self.to_core.bind(channel.input_address)
        self.from_core.bind(channel.output_address)
        self.core_pid = core_pid
        self.process: multiprocessing.process.BaseProcess | None = None  # the core, when this client owns it
        self._send_lock = threading.Lock()  # a ZeroMQ socket is used by one thread at a time

    def send(self, message: object, audio: np.ndarray | None = None) -> None:
        """Sends without ever blocking the caller's event loop: a PUSH socket whose core has gone (no peer left
        on the IPC path) would block forever, so a send that cannot be queued at once means the core is gone.
        A live core never refuses one (the send queue is unbounded)."""
        frames = [dumps(message)] if audio is None else [dumps(message), audio]
        try:
            with self._send_lock:
                self.to_core.send_multipart(frames, flags=zmq.NOBLOCK, copy=audio is None)
        except zmq.Again:
            raise EngineDeadError("engine stopped: the engine core is not reachable") from None

    def core_alive(self) -> bool:
        if self.process is not None:
            return self.process.is_alive()
        return self.core_pid is not None and _pid_alive(self.core_pid)

    def describe_exit(self) -> str:
        if self.process is None:
            return f"process {self.core_pid} exited"
        self.process.join(timeout=5)
        return f"exited with code {self.process.exitcode}"

    def close(self) -> None:
        self.to_core.close()
        self.from_core.close()
        self.context.term()


class MPClient(CoreClient):
    def __init__(self, spec: EngineCoreSpec, *, max_waiting: int = 1024, startup_timeout_s: float = 1800.0,
                 policy: RestartPolicy = RestartPolicy(),
                 _shared: tuple[CoreChannel, int, str] | None = None) -> None:
        """Starts a core of its own for ``spec``; ``attach`` instead joins a ``SharedEngineCore``."""
        self.spec = spec
        self._owns_core = _shared is None
        self._directory = tempfile.mkdtemp(prefix="oasr-core-") if _shared is None else None
        if _shared is None:
            channel = CoreChannel(f"ipc://{self._directory}/input", f"ipc://{self._directory}/output")
            id_prefix, core_pid = "core-", None
        else:
            channel, core_pid, id_prefix = _shared
        self._channel = channel
        sockets = _Sockets(channel, core_pid)
        if _shared is None:
            sockets.process = _spawn_core(spec, (channel,))
            sockets.core_pid = sockets.process.pid
        try:
            info = self._wait_ready(sockets, startup_timeout_s)
        except BaseException:
            if sockets.process is not None:
                _join_or_kill(sockets.process)
            sockets.close()
            self._remove_directory()
            raise
        super().__init__(info, sockets, max_waiting=max_waiting, id_prefix=id_prefix)
        self._sockets = sockets
        self._budget = RestartBudget(policy)
        self._restart_at: float | None = None  # when the next core is due (an owned core that died)
        self._closing = threading.Event()
        self._receiver = threading.Thread(target=self._receive_loop, name="oasr-core-receiver", daemon=True)
        self._receiver.start()

    @classmethod
    def attach(cls, spec: EngineCoreSpec, channel: CoreChannel, core_pid: int, worker_id: int, *,
               max_waiting: int = 1024, startup_timeout_s: float = 1800.0) -> MPClient:
        """A client of a ``SharedEngineCore`` (started elsewhere with ``spec``) on its channel ``channel``;
        its request ids start with ``w<worker_id>-`` so they never collide with another worker's."""
        return cls(spec, max_waiting=max_waiting, startup_timeout_s=startup_timeout_s,
                   _shared=(channel, core_pid, f"w{worker_id}-"))

    @property
    def pid(self) -> int | None:
        """The engine core's process id."""
        return self._sockets.core_pid

    def shutdown(self) -> None:
        """Stops the core (asking first, then terminating) and the receiver; waiting requests fail. An attached
        client aborts its own requests instead and leaves the shared core running."""
        if self._closing.is_set():
            return
        self._closing.set()
        if self._sockets.core_alive():
            if self._owns_core:
                self.send_if_reachable(StopCore())
            else:
                requests, streams = self.own_ids()
                if requests:
                    self.send_if_reachable(AbortRequests(requests))
                if streams:
                    self.send_if_reachable(AbortStreams(streams))
        if self._sockets.process is not None:
            _join_or_kill(self._sockets.process)
        self._receiver.join(timeout=STOP_WAIT_S)  # it wakes every RECEIVE_POLL_MS; a busy machine may be slow
        self.fail_all("the engine core was shut down")
        if self._receiver.is_alive():  # closing sockets under its poll would abort the process: leave them
            log.warning("the engine-core receiver did not stop; leaving its sockets open")
            return
        self._sockets.close()
        self._remove_directory()

    def _remove_directory(self) -> None:
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)

    # ------------------------------------------------------------------ start

    def _wait_ready(self, sockets: _Sockets, timeout_s: float) -> EngineInfo:
        poller = zmq.Poller()
        poller.register(sockets.from_core, zmq.POLLIN)
        if sockets.process is not None:
            poller.register(sockets.process.sentinel, zmq.POLLIN)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            events = dict(poller.poll(1000))
            if sockets.from_core in events:
                message = loads(sockets.from_core.recv())
                if isinstance(message, CoreReady):
                    sockets.core_pid = message.info.pid or sockets.core_pid
                    return message.info
                if isinstance(message, CoreFailed):
                    raise EngineStartupError(f"the engine could not start {self.spec.model}: {message.message}")
            elif events or not sockets.core_alive():
                raise EngineStartupError(f"the engine core {sockets.describe_exit()} while starting "
                                         f"{self.spec.model}")
        raise EngineStartupError(f"the engine core did not start {self.spec.model} within {timeout_s:g} s")

    # ------------------------------------------------------------------ the receiver thread

    def _receive_loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sockets.from_core, zmq.POLLIN)
        watched = None  # the core process whose sentinel the poller holds
        while not self._closing.is_set():
            process = self._sockets.process
            if process is not watched:
                if watched is not None:
                    poller.unregister(watched.sentinel)
                if process is not None:
                    poller.register(process.sentinel, zmq.POLLIN)
                watched = process
            events = dict(poller.poll(RECEIVE_POLL_MS))
            if self._sockets.from_core in events:
                self._drain()
            if self._closing.is_set():
                return
            if process is not None and not process.is_alive():
                self._core_down(f"the engine core {self._sockets.describe_exit()}")
            elif not self._owns_core and self._state == "ok" and not self._sockets.core_alive():
                self._core_down(f"the engine core {self._sockets.describe_exit()}")
            if self._restart_at is not None and time.monotonic() >= self._restart_at:
                self._restart_at = None
                self._sockets.process = _spawn_core(self.spec, (self._channel,))
                self._sockets.core_pid = self._sockets.process.pid

    def _drain(self) -> None:
        """Dispatches every message waiting now."""
        while True:
            try:
                message = loads(self._sockets.from_core.recv(zmq.NOBLOCK))
            except zmq.Again:
                return
            if isinstance(message, CoreUpdate):
                if self._state == "ok":
                    self.dispatch(message)
            elif isinstance(message, CoreReady):
                if self._state == "starting":
                    self._sockets.core_pid = message.info.pid or self._sockets.core_pid
                    self._budget.started()
                    self.restarted(message.info)
                    log.warning("a new engine core serves %s (process %s)", self.spec.model, self._sockets.core_pid)
            elif isinstance(message, CoreFailed) and self._state == "ok":
                self._core_down(message.message)

    def _core_down(self, reason: str) -> None:
        """The core died (or its loop failed): fail what waits, and start the next core when one is due."""
        if self._closing.is_set():
            return
        if not self._owns_core:  # the main process restarts a shared core; wait for its CoreReady
            log.error("engine unavailable: %s; waiting for the next engine core", reason)
            self.fail_all(reason, restarting=True)
            return
        delay = self._budget.died()
        log.error("engine unavailable: %s%s", reason,
                  "" if delay is None else f"; starting a new engine core in {delay:.1f} s")
        self.fail_all(reason, restarting=delay is not None)
        process = self._sockets.process
        if process is not None:
            if process.is_alive():
                process.kill()  # its loop failed but the process lingers: it is replaced whole
            process.join(timeout=STOP_WAIT_S)
            self._sockets.process = None  # handled: the next one is started when due
        if delay is not None:
            self._restart_at = time.monotonic() + delay


def start_mp(model: str, *, device: str = "auto", dtype: str | None = None, config=None, streaming=None,
             quantization: str | None = None, cpu_threads: int | None = None, max_waiting: int = 1024,
             policy: RestartPolicy = RestartPolicy(), diarization_model: str | None = None) -> MPClient:
    """Serves ``model`` (and ``diarization_model`` beside it) from a supervised engine-core process."""
    spec = EngineCoreSpec(model, device, dtype, config, logging.getLogger().getEffectiveLevel(), cpu_threads,
                          streaming=streaming, quantization=quantization, diarization_model=diarization_model)
    return MPClient(spec, max_waiting=max_waiting, policy=policy)
