"""``build_app(engine, settings)``: the OpenAI-compatible FastAPI app; ``serve``: load, build, run under uvicorn."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse

from oasr.serving.engine_client import EngineClient
from oasr.serving.metrics import MetricsMiddleware
from oasr.serving.protocol import APIError, internal_error
from oasr.serving.router import build_router
from oasr.serving.serving import OpenAIServingTranscription
from oasr.serving.settings import ServerSettings

log = logging.getLogger(__name__)
GRACEFUL_SHUTDOWN_S = 5  # open streams get this long to finish on Ctrl-C / SIGTERM


def build_app(engine: EngineClient, settings: ServerSettings) -> FastAPI:
    """Everything the app holds lives on ``app.state``; two apps in one process share nothing."""
    app = FastAPI(title="OASR", summary="OpenAI-compatible speech-to-text", docs_url=None, redoc_url=None)
    app.state.serving = OpenAIServingTranscription(engine, settings)
    app.state.created = int(time.time())
    app.include_router(build_router())
    app.add_middleware(MetricsMiddleware, metrics=app.state.serving.metrics)
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


def serve(model: str, settings: ServerSettings, *, host: str, port: int, device: str = "auto",
          dtype: str | None = None) -> None:
    """Loads ``model``, starts its engine thread and serves until interrupted."""
    import uvicorn

    from oasr.engine.async_engine import AsyncEngine
    from oasr.models.loader import from_pretrained

    loaded = from_pretrained(model, device=device, dtype=dtype)
    engine = AsyncEngine(loaded)
    try:
        log.info("serving %s (%s) on http://%s:%d", settings.served_model_name, loaded.device, host, port)
        uvicorn.run(build_app(engine, settings), host=host, port=port, timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
                    log_level=logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower())
    finally:
        engine.shutdown()
