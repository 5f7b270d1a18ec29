"""``build_app(engine, settings)``: the OpenAI-compatible FastAPI app; ``serve``: load, build, run under uvicorn."""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import JSONResponse

from oasr.engine.config import EngineConfig
from oasr.serving.auth import KeyedDocumentsMiddleware
from oasr.serving.connections import uvicorn_config
from oasr.hosting.engine_client import EngineClient
from oasr.serving.hosts import AllowedHostsMiddleware
from oasr.serving.lifecycle import ServerLifecycle
from oasr.serving.metrics import MetricsMiddleware
from oasr.serving.protocol import APIError, internal_error
from oasr.serving.realtime.connection import RealtimeService
from oasr.serving.router import build_router
from oasr.serving.server_decoding import preflight, with_server_decoding
from oasr.serving.server_log import AccessLogMiddleware, Banner, log_banner, show_server_log
from oasr.serving.serving import OpenAIServingTranscription
from oasr.serving.settings import ServerSettings
from oasr.streaming.types import StreamingConfig

if TYPE_CHECKING:
    from oasr.hosting.ray_replicas import ReplicaOptions
    from oasr.serving.grpc.server import GrpcFrontEnd

log = logging.getLogger(__name__)


def build_app(engine: EngineClient, settings: ServerSettings) -> FastAPI:
    """Everything the app holds lives on ``app.state``; two apps in one process share nothing."""
    app = FastAPI(title="OASR", summary="OpenAI-compatible speech-to-text", docs_url=None, redoc_url=None)
    engine = with_server_decoding(engine, settings.decoding, settings.served_model_name)
    app.state.serving = OpenAIServingTranscription(engine, settings)
    app.state.realtime = RealtimeService(app.state.serving)  # /v1/realtime's sessions, beside the uploads
    app.state.lifecycle = ServerLifecycle(app.state.serving)  # what /health says; the server drains it
    app.state.created = int(time.time())
    # --diarization-model's engine object beside the core (oasr.serving.diarization): /v1/audio/diarization
    # and the speakers of transcriptions share it
    app.state.diarization = app.state.serving.diarization
    app.include_router(build_router())
    app.add_middleware(MetricsMiddleware, metrics=app.state.serving.metrics)
    app.add_middleware(KeyedDocumentsMiddleware, keys=settings.api_keys)  # /openapi.json: the key, as /v1
    if settings.cors_allow_origins:
        # Bearer keys travel in a header, not in cookies: no credentials mode. Any request header, since
        # OpenAI's JavaScript client sends its own (x-stainless-*); Retry-After readable by the page.
        app.add_middleware(CORSMiddleware, allow_origins=list(settings.cors_allow_origins),
                           allow_methods=["GET", "POST"], allow_headers=["*"], expose_headers=["Retry-After"])
    app.add_middleware(AllowedHostsMiddleware, allowed=settings.allowed_hosts)  # before CORS too
    app.add_middleware(AccessLogMiddleware)  # outermost: requests refused for their Host are logged too
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(Exception, _unexpected_error)
    return app


def error_response(error: APIError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


async def _api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, APIError)
    return error_response(exc)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        message = f"Unknown request URL: {request.method} {request.url.path}."
    elif exc.status_code == 405:
        message = f"Method {request.method} is not allowed for {request.url.path}."
    else:
        message = str(exc.detail)
    return error_response(APIError(exc.status_code, message, headers=dict(exc.headers or {})))


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    first = exc.errors()[0] if exc.errors() else {}
    param = str(first.get("loc", ["", ""])[-1]) or None
    return error_response(APIError(400, f"Invalid value for '{param}': {first.get('msg', 'invalid')}.", param=param))


async def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    log.error("unhandled error in %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(internal_error())


def served_name(model: str) -> str:
    """A model directory is listed by its folder name, so /v1/models does not show the server's paths."""
    path = Path(model).expanduser()
    return path.name if path.is_dir() else model


ENGINE_MODES = ("process", "thread")


def start_engine(model: str, *, mode: str = "process", device: str = "auto", dtype: str | None = None,
                 config: EngineConfig | None = None, max_waiting: int = 1024,
                 cpu_threads: int | None = None, quantization: str | None = None,
                 streaming: StreamingConfig | None = None, diarization_model: str | None = None) -> EngineClient:
    """The engine behind the server: in a process of its own (``process``: nothing the HTTP side does competes
    with its step loop for the interpreter lock), or on a thread of this process (``thread``).
    ``cpu_threads`` sets torch's CPU threads in a core process; ``quantization`` quantizes a full-precision
    checkpoint at load (``from_pretrained``); ``streaming``, a streaming model's stream slots;
    ``diarization_model``, a diarization checkpoint the core serves beside the model."""
    if mode == "process":
        from oasr.hosting.mp import start_mp

        return start_mp(model, device=device, dtype=dtype, config=config, streaming=streaming,
                        quantization=quantization, cpu_threads=cpu_threads, max_waiting=max_waiting,
                        diarization_model=diarization_model)
    if mode == "thread":
        from oasr.hosting.inproc import start_inproc

        return start_inproc(model, device=device, dtype=dtype, config=config, streaming=streaming,
                            quantization=quantization, max_waiting=max_waiting, diarization_model=diarization_model)
    raise ValueError(f"unknown engine mode {mode!r}; choose one of {', '.join(ENGINE_MODES)}")


def serve(model: str, settings: ServerSettings, *, host: str, port: int, device: str = "auto",
          dtype: str | None = None, engine_mode: str = "process", api_workers: int = 1,
          replicas: ReplicaOptions | None = None, quantization: str | None = None,
          streaming: StreamingConfig | None = None, config: EngineConfig | None = None) -> None:
    """Starts the engine for ``model`` and serves until SIGINT or SIGTERM; the engine stops with the server
    (an engine core process is asked to stop and its socket directory removed).
    ``api_workers`` > 1 serves from that many HTTP worker processes sharing one engine core (process mode);
    ``replicas`` serves from engine replicas on Ray instead of one engine (``oasr.hosting.ray_replicas``);
    ``config``: the engine's (each replica's) configuration."""
    show_server_log(settings.log_format)  # type: ignore[arg-type]  # ServerSettings checked it is a LogFormat
    url = base_url(host, port)
    if api_workers > 1:
        if engine_mode != "process":
            raise ValueError("--api-workers above 1 needs --engine-mode process (the workers share one core)")
        if settings.grpc is not None:
            raise ValueError("--grpc-port serves from the one API process: leave --api-workers at 1")
        from oasr.serving.workers import serve_workers

        ready = threading.Event()  # set once the workers are started (they listen a moment later)
        banner = Banner(settings.served_model_name, device, f"{api_workers} API workers", url)
        threading.Thread(target=lambda: ready.wait() and log_banner(banner), name="oasr-banner", daemon=True).start()
        serve_workers(model, settings, host=host, port=port, api_workers=api_workers, device=device, dtype=dtype,
                      quantization=quantization, streaming=streaming, config=config, on_ready=ready,
                      build_app=build_app, server_class=ServingServer)
        return

    with stopped_by_signals():
        if replicas is not None:
            from oasr.hosting.ray_replicas import start_replicas

            engine = start_replicas(model, replicas, device=device, dtype=dtype, quantization=quantization,
                                    config=config, streaming=streaming)  # each replica's final model, if any
            described = f"{replicas.num_replicas} engine replicas on Ray"
        else:
            # --diarization-model runs in the engine core, beside the model (on Ray, in the API process)
            engine = start_engine(model, mode=engine_mode, device=device, dtype=dtype, quantization=quantization,
                                  streaming=streaming, config=config, diarization_model=settings.diarization_model)
            described = f"engine in a {engine_mode}"
        try:
            app = build_app(engine, settings)
            if settings.decoding is not None:  # the search every transcription runs, said where the server starts
                described += f"; every transcription decodes with a {settings.decoding.describe()}"
            banner = Banner(settings.served_model_name, engine_device(engine, device), described, url)
            level = logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower()
            server_config = uvicorn_config(app, settings, host=host, port=port, log_level=level)
            ServingServer(server_config, app.state.lifecycle, on_started=lambda: log_banner(banner),
                          grpc=grpc_front_end(app, settings, host),
                          preflight=lambda: preflight(app.state.serving.engine)).run()
        finally:
            engine.shutdown()


class ServingServer(uvicorn.Server):
    """uvicorn's server, which calls ``on_started`` once it listens and drains ``lifecycle`` (/health says
    ``draining``) the moment it starts shutting down, before its requests in flight have finished."""

    def __init__(self, config: uvicorn.Config, lifecycle: ServerLifecycle, on_started: Callable[[], None],
                 grpc: GrpcFrontEnd | None = None, preflight: Callable[[], Awaitable[None]] | None = None) -> None:
        super().__init__(config)
        self.lifecycle = lifecycle
        self.on_started = on_started
        self.grpc = grpc  # the Riva gRPC service, on this server's event loop
        self.preflight = preflight  # awaited before anything listens; what it raises stops the server

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        if self.preflight is not None:
            await self.preflight()
        if self.grpc is not None:  # first: a port it cannot bind stops the server before HTTP listens
            await self.grpc.start()
        await super().startup(sockets)
        if self.started and not self.should_exit:
            self.on_started()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.lifecycle.drain()
        if self.grpc is not None:
            await self.grpc.stop()
        await super().shutdown(sockets)


def grpc_front_end(app: FastAPI, settings: ServerSettings, host: str) -> GrpcFrontEnd | None:
    """``oasr serve --grpc-port``'s service over ``app``'s serving objects, or None without the flag."""
    if settings.grpc is None:
        return None
    from oasr.serving.grpc.server import GrpcFrontEnd

    return GrpcFrontEnd(app.state.realtime, app.state.lifecycle, settings.grpc, host)


def base_url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def engine_device(engine: EngineClient, requested: str) -> str:
    """The device the engine loaded its model on, as its client knows it (a core's ready message, a thread
    engine's model); the device asked for where no one client knows (replicas)."""
    info = getattr(engine, "info", None)
    if info is not None:
        return str(info.device)
    loaded = getattr(engine, "loaded", None)
    return str(loaded.device) if loaded is not None else requested


@contextlib.contextmanager
def stopped_by_signals() -> Iterator[None]:
    """SIGTERM and SIGINT end the block by raising KeyboardInterrupt (once: a second signal during the cleanup
    is ignored), which the block's ``finally`` clauses unwind through and which ends here.

    While uvicorn serves, its own handlers take both signals and shut it down gracefully; then it restores
    these handlers and raises the signal again. Without them SIGTERM's default action would end the process
    there, before the engine is shut down, leaving the core's socket directory behind; and a signal while the
    model is still loading must stop that too."""
    if threading.current_thread() is not threading.main_thread():  # signal handlers belong to the main thread
        yield
        return
    interrupted = threading.Event()

    def interrupt(signum: int, frame) -> None:
        if not interrupted.is_set():
            interrupted.set()
            raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    except KeyboardInterrupt:
        log.info("stopped by a signal")
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
