"""The engine core on a thread of this process (``oasr serve --engine-mode thread``, tests, a Ray replica).

The thread owns the core (nothing else touches it): it runs ``oasr.hosting.loop.run_core`` over a queue that
callers on any thread put messages into, and hands each update straight to the client's ``dispatch``. Tensor work
releases the GIL, so request handling on the event loop keeps running while the device is busy.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import numpy as np

from oasr.hosting.client import CoreClient
from oasr.hosting.core import EngineCore, describe
from oasr.hosting.loop import Envelope, QueueInbox, run_core
from oasr.hosting.protocol import CoreUpdate, StopCore
from oasr.hosting.relay import EngineDeadError

log = logging.getLogger(__name__)
STOP_WAIT_S = 30.0


class CoreThread:
    """A core's loop on a thread, fed by ``send``; ``on_update(update)`` and ``on_failure(reason)`` are called on
    that thread (one client: client 0)."""

    def __init__(self, core: EngineCore, on_update: Callable[[CoreUpdate], None],
                 on_failure: Callable[[str], None]) -> None:
        self.core = core
        self._inbox = QueueInbox()
        self._on_update = on_update
        self._on_failure = on_failure
        self._error: str | None = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="oasr-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def send(self, message: object, audio: np.ndarray | None = None) -> None:
        if self._error is not None or self._stopping.is_set():
            raise EngineDeadError(f"engine stopped: {self._error or 'shut down'}")
        self._inbox.put(Envelope(0, message, audio))

    def core_alive(self) -> bool:
        return self._error is None and self._thread.is_alive()

    def describe_exit(self) -> str:
        return f"loop stopped ({self._error or 'shut down'})"

    def stop(self) -> None:
        if not self._stopping.is_set():
            self._stopping.set()
            self._inbox.put(Envelope(0, StopCore()))
        self._thread.join(timeout=STOP_WAIT_S)

    def _run(self) -> None:
        try:
            run_core(self.core, self._inbox, lambda client, update: self._on_update(update), 1)
        except BaseException as exc:  # the loop must not die silently: fail every waiting caller
            log.exception("the engine loop stopped")
            self._error = describe(exc)
            self._on_failure(self._error)


class InprocClient(CoreClient):
    """A ``CoreClient`` whose core runs on a thread of this process."""

    def __init__(self, core: EngineCore, *, max_waiting: int = 1024) -> None:
        self._thread = CoreThread(core, self._take, self._lost)
        super().__init__(core.info(), self._thread, max_waiting=max_waiting, id_prefix="async-")
        self._thread.start()

    @property
    def core(self) -> EngineCore:
        return self._thread.core

    def _take(self, update: CoreUpdate) -> None:
        self.dispatch(update)

    def _lost(self, reason: str) -> None:
        self.fail_all(reason)

    def shutdown(self) -> None:
        self._thread.stop()
        self.fail_all("the engine was shut down")


def start_inproc(model: str, *, device: str = "auto", dtype: str | None = None, config=None, streaming=None,
                 quantization: str | None = None, max_waiting: int = 1024,
                 diarization_model: str | None = None) -> InprocClient:
    """Loads ``model`` (and ``diarization_model`` beside it) and serves it from a thread of this process."""
    from oasr.hosting.core import build_diarizer, build_engine
    from oasr.hosting.protocol import EngineCoreSpec

    spec = EngineCoreSpec(model, device, dtype, config, streaming=streaming, quantization=quantization,
                          diarization_model=diarization_model)
    return InprocClient(EngineCore(build_engine(spec), build_diarizer(spec)), max_waiting=max_waiting)
