"""``oasr serve --api-workers N``: one engine core, N HTTP worker processes on one host:port.

One API process is bound by its interpreter lock (uvicorn, multipart parsing, audio decoding, building
responses) long before the engine core is busy. Here the main process starts the engine core for N clients
(``SharedEngineCore``) and spawns N workers; each runs the FastAPI app with its own ``MPClient``
attached to its own channel of the core, on a listening socket of its own bound to the same host:port with
SO_REUSEPORT, so that the kernel spreads new connections evenly over the workers (one shared listening socket
lets whichever worker wakes first take a burst of connections, and keep-alive clients then stay on it).
The main process holds the port bound (not listening) with SO_REUSEPORT, so that a port in use fails at once.

- A worker's requests are its own: ids carry the worker id, the core answers on that worker's channel, and a
  client's disconnect aborts its request in the core from whichever worker served it.
- When the core dies every worker sees it (by the core's process id): requests get 503 and /health says
  ``starting`` while the main process starts a new core (``SharedEngineCore``); the workers serve again once it
  has loaded the model.
- Ctrl-C or SIGTERM to the main process: the workers get SIGTERM (uvicorn's graceful shutdown), then the
  core is terminated. A worker whose main process disappears stops itself; so does the core.
- /metrics: HTTP counters, histograms and in-flight requests are summed over the workers (prometheus_client's
  multiprocess mode, in a temporary directory); engine numbers come from the core. ``max_in_flight``, the
  per-client and per-key caps and ``max_waiting`` hold per worker.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import wait

from oasr.engine.config import EngineConfig
from oasr.serving.settings import ServerSettings
from oasr.streaming.types import StreamingConfig

log = logging.getLogger(__name__)
WORKER_STOP_S = 15.0  # a worker asked to stop gets this long (uvicorn's graceful shutdown is shorter)
PARENT_POLL_S = 1.0  # a worker looks this often whether the main process is still there


def serve_workers(model: str, settings: ServerSettings, *, host: str, port: int, api_workers: int,
                  device: str = "auto", dtype: str | None = None, config: EngineConfig | None = None,
                  cpu_threads: int | None = None, max_waiting: int = 1024,
                  on_ready: threading.Event | None = None, quantization: str | None = None,
                  streaming: StreamingConfig | None = None, build_app: Callable, server_class: type) -> None:
    """Serves with ``api_workers`` worker processes until SIGINT or SIGTERM; returns once all have stopped.
    ``build_app(engine, settings)`` and ``server_class`` (``oasr.serving.app``'s ``build_app`` and
    ``ServingServer``) are what each worker runs: handed in by ``serve``, whose module starts this one, so the
    two modules do not import each other (a spawned worker unpickles them by name)."""
    from oasr.hosting.mp import SharedEngineCore
    from oasr.hosting.protocol import EngineCoreSpec
    from oasr.serving.metrics import MULTIPROC_ENV

    if api_workers < 1:
        raise ValueError(f"api_workers must be >= 1, got {api_workers}")
    level = logging.getLogger().getEffectiveLevel()
    spec = EngineCoreSpec(model, device, dtype, config, level, cpu_threads, streaming=streaming,
                          quantization=quantization, diarization_model=settings.diarization_model)
    metrics_dir = tempfile.mkdtemp(prefix="oasr-metrics-")
    previous_env = os.environ.get(MULTIPROC_ENV)
    os.environ[MULTIPROC_ENV] = metrics_dir  # spawned workers inherit it before they import prometheus_client
    stop = threading.Event()
    previous_handlers = {sig: signal.signal(sig, lambda signum, frame: stop.set())
                         for sig in (signal.SIGINT, signal.SIGTERM)} \
        if threading.current_thread() is threading.main_thread() else {}
    sock = _reuseport_socket(host, port)  # bound, not listening: it reserves the port, takes no connections
    core = SharedEngineCore(spec, api_workers)
    workers: list[multiprocessing.process.BaseProcess] = []
    try:
        context = multiprocessing.get_context("spawn")
        for worker_id, channel in enumerate(core.channels):
            worker = context.Process(target=_worker_main, name=f"oasr-api-worker-{worker_id}",
                                     args=(spec, channel, core.pid, worker_id, settings, host, port, max_waiting,
                                           level, build_app, server_class))
            worker.start()
            workers.append(worker)
        log.info("serving %s on http://%s:%d with %d API workers", settings.served_model_name, host, port,
                 api_workers)
        if on_ready is not None:
            on_ready.set()
        _supervise(core, workers, stop)
    finally:
        _stop_workers(workers)
        core.stop()
        sock.close()
        shutil.rmtree(metrics_dir, ignore_errors=True)
        if previous_env is None:
            os.environ.pop(MULTIPROC_ENV, None)
        else:
            os.environ[MULTIPROC_ENV] = previous_env
        for sig, handler in previous_handlers.items():
            signal.signal(sig, handler)


def _reuseport_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


def _supervise(core, workers: list[multiprocessing.process.BaseProcess], stop: threading.Event) -> None:
    """Waits for a stop signal or a worker's exit. The core supervises itself (``SharedEngineCore``: a core that
    dies is started again while the workers answer 503)."""
    while not stop.is_set():
        ready = wait([w.sentinel for w in workers], timeout=0.5)
        for worker in workers:
            if worker.sentinel in ready:
                log.error("API worker %s exited with code %s; stopping the server", worker.name,
                          worker.exitcode)
                return


def _stop_workers(workers: list[multiprocessing.process.BaseProcess]) -> None:
    for worker in workers:
        if worker.is_alive() and worker.pid is not None:
            os.kill(worker.pid, signal.SIGTERM)
    deadline = time.monotonic() + WORKER_STOP_S
    for worker in workers:
        worker.join(timeout=max(0.0, deadline - time.monotonic()))
        if worker.is_alive():
            log.warning("API worker %s did not stop in %g s; killing it", worker.name, WORKER_STOP_S)
            worker.kill()
            worker.join()


def _worker_main(spec, channel, core_pid: int, worker_id: int, settings: ServerSettings, host: str, port: int,
                 max_waiting: int, level: int, build_app: Callable, server_class: type) -> None:
    """One API worker: the app on its own client of the shared core, listening on the shared port."""
    from oasr.heap import bound_heap

    bound_heap()

    from oasr.hosting.mp import MPClient
    from oasr.serving.metrics import MULTIPROC_ENV
    from oasr.serving.connections import uvicorn_config
    from oasr.serving.server_log import show_server_log

    logging.basicConfig(level=level, format=f"%(levelname)s %(name)s [api worker {worker_id}]: %(message)s")
    show_server_log(settings.log_format)  # each worker logs the requests it serves
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group; the main process decides
    parent = os.getppid()
    engine = MPClient.attach(spec, channel, core_pid, worker_id, max_waiting=max_waiting)
    try:
        inner = build_app(engine, settings)
        app = WorkerHeader(inner, worker_id)
        config = uvicorn_config(app, settings, log_level=logging.getLevelName(level).lower())
        server = server_class(config, inner.state.lifecycle, on_started=lambda: None)  # the main process greets
        orphaned = threading.Event()
        threading.Thread(target=_watch_parent, args=(parent, server, orphaned), name="oasr-parent-watch",
                         daemon=True).start()
        sock = _reuseport_socket(host, port)
        sock.listen(2048)
        try:
            server.run(sockets=[sock])
        finally:
            sock.close()
    finally:
        engine.shutdown()
        if orphaned.is_set():  # the main process was killed: nobody else removes the metrics directory
            shutil.rmtree(os.environ.get(MULTIPROC_ENV, ""), ignore_errors=True)


class WorkerHeader:
    """Marks every HTTP response with the worker that answered (``x-oasr-api-worker: <id>``), so operators and
    tests can see how connections spread over the workers."""

    def __init__(self, app, worker_id: int) -> None:
        self.app = app
        self.header = (b"x-oasr-api-worker", str(worker_id).encode())

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_marked(message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), self.header]}
            await send(message)

        await self.app(scope, receive, send_marked)


def _watch_parent(parent: int, server, orphaned: threading.Event) -> None:
    while not server.should_exit:
        if os.getppid() != parent:
            log.warning("the main server process is gone; this API worker stops")
            orphaned.set()
            server.should_exit = True
            return
        time.sleep(PARENT_POLL_S)
