"""The engine core's loop, written once: every host (a thread of the server, the engine-core process, a Ray
actor) runs ``run_core`` with an inbox of its own kind and a way to hand each client its update.

Each iteration takes every message waiting now (a burst of requests joins the next step), tells the core of
clients whose channel dropped, runs one engine step, and hands each client the update it has to hear. An idle core
(nothing ready to step) waits for the next message, waking every ``IDLE_WAIT_S`` to see whether it should stop.

With ``OASR_CORE_PROFILE=PATH`` in its environment (a spawned core process inherits the server's), the loop runs
under cProfile and writes its statistics to ``PATH.<pid>`` when it ends, raised, returned or terminated
(``python -m pstats`` reads them): where a core's time goes under a live load, host side.
"""

from __future__ import annotations

import cProfile
import os
import queue
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from oasr.heap import HeapTrimmer
from oasr.hosting.core import EngineCore
from oasr.hosting.protocol import CoreUpdate

IDLE_WAIT_S = 0.5
PROFILE_ENV = "OASR_CORE_PROFILE"


@dataclass(frozen=True)
class Envelope:
    """One message as a host receives it: who sent it, the message, and its audio frame if it has one."""

    client: int
    message: object
    audio: np.ndarray | None = None


class Inbox(Protocol):
    def receive(self, timeout_s: float) -> list[Envelope]:
        """Every message waiting now; when there is none, waits up to ``timeout_s`` for the first."""

    def dropped(self) -> list[int]:
        """Clients whose channel dropped since the last call."""


def run_core(core: EngineCore, inbox: Inbox, deliver: Callable[[int, CoreUpdate], None], num_clients: int,
             keep_going: Callable[[], bool] = lambda: True) -> None:
    """Runs ``core`` until a ``StopCore`` arrives or ``keep_going()`` turns False. Exceptions propagate: the host
    decides what a dead loop means (fail its clients, end its process)."""
    path = os.environ.get(PROFILE_ENV)
    if not path:
        _loop(core, inbox, deliver, num_clients, keep_going)
        return
    target = f"{path}.{os.getpid()}"
    profiler = cProfile.Profile()
    restore = _dump_on_terminate(profiler, target)
    profiler.enable()
    try:
        _loop(core, inbox, deliver, num_clients, keep_going)
    finally:
        profiler.disable()
        profiler.dump_stats(target)
        restore()


def _dump_on_terminate(profiler: cProfile.Profile, target: str) -> Callable[[], None]:
    """A shared core process is stopped by SIGTERM (``SharedEngineCore.stop``), which runs no ``finally``: where
    SIGTERM still does its default on this main thread, the profile is written first and the signal then does what
    it did. -> a function that puts the default back."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return lambda: None

    def on_terminate(signum: int, frame: object) -> None:
        profiler.disable()
        profiler.dump_stats(target)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    signal.signal(signal.SIGTERM, on_terminate)
    return lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _loop(core: EngineCore, inbox: Inbox, deliver: Callable[[int, CoreUpdate], None], num_clients: int,
          keep_going: Callable[[], bool]) -> None:
    trimmer = HeapTrimmer()  # requests' audio and results churn the heap; its free pages go back each second
    while keep_going():
        trimmer.maybe_trim()
        for envelope in inbox.receive(0.0 if core.has_ready_work else IDLE_WAIT_S):
            if not core.handle(envelope.message, envelope.audio, envelope.client):
                return
        for client in inbox.dropped():
            core.drop_client(client)
        for client, update in core.step_all(num_clients).items():
            deliver(client, update)


class QueueInbox:
    """An inbox fed by threads of the same process (``put``); its clients never drop."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Envelope] = queue.SimpleQueue()

    def put(self, envelope: Envelope) -> None:
        self._queue.put(envelope)

    def receive(self, timeout_s: float) -> list[Envelope]:
        try:
            received = [self._queue.get(timeout=timeout_s) if timeout_s > 0 else self._queue.get_nowait()]
        except queue.Empty:
            return []
        while True:
            try:
                received.append(self._queue.get_nowait())
            except queue.Empty:
                return received

    def dropped(self) -> list[int]:
        return []
