"""What ``oasr serve`` prints without ``-v``: a banner once the engine is ready and the server listens, and
one access-log line per request (per WebSocket session, when it ends). Both go to the ``oasr.server`` logger;
``show_server_log`` gives it a stderr handler of its own, so they show whatever level the root logger has, in
``text`` (for people) or ``json`` (one object per line, for log collectors).

Access lines carry the path without its query string: a query may hold what a client meant to keep private.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import asdict, dataclass
from typing import Literal, TextIO

LogFormat = Literal["text", "json"]
LOG_FORMATS: tuple[LogFormat, ...] = ("text", "json")
SERVER_LOG = "oasr.server"
log = logging.getLogger(SERVER_LOG)


@dataclass(frozen=True)
class AccessRecord:
    client: str  # the peer's address ("-" when unknown)
    method: str  # "GET", "POST"; "WS" for a WebSocket session
    path: str
    status: int | None  # None: the client left before any response began
    duration_ms: float


@dataclass(frozen=True)
class Banner:
    model: str  # the served name, as clients send it
    device: str
    engine: str  # how the engine runs ("process", "thread", "2 replicas on Ray", "4 API workers")
    url: str  # http://HOST:PORT


# The routes a user reaches first, with what each is for (``oasr serve --help`` lists every one).
BANNER_ROUTES = (
    ("POST", "/v1/audio/transcriptions", "speech to text (OpenAI-compatible; stream=true for live events)"),
    ("POST", "/v1/audio/translations", "speech to English text"),
    ("WS", "/v1/realtime?intent=transcription", "live transcription (OpenAI Realtime, GA and beta)"),
    ("GET", "/", "the page: microphone captions and file transcripts"),
    ("GET", "/health", "200 {\"status\": \"ok\"} once ready; 503 while starting, draining or dead"),
    ("GET", "/metrics", "Prometheus metrics"),
)


def route_url(base_url: str, method: str, path: str) -> str:
    return ("ws" + base_url.removeprefix("http") if method == "WS" else base_url) + path


class ServerLogFormatter(logging.Formatter):
    """Access records and the banner as text or JSON; any other record as ``LEVEL name: message``."""

    converter = time.gmtime  # times in UTC, marked as such: log collectors compare them across hosts

    def __init__(self, log_format: LogFormat) -> None:
        super().__init__(datefmt="%Y-%m-%dT%H:%M:%SZ")
        self.log_format = log_format

    def format(self, record: logging.LogRecord) -> str:
        access: AccessRecord | None = getattr(record, "access", None)
        banner: Banner | None = getattr(record, "banner", None)
        when = self.formatTime(record, self.datefmt)
        if self.log_format == "json":
            if access is not None:
                return json.dumps({"time": when, "event": "request", **asdict(access)})
            if banner is not None:
                routes = {path: route_url(banner.url, method, path) for method, path, _ in BANNER_ROUTES}
                return json.dumps({"time": when, "event": "ready", **asdict(banner), "routes": routes})
            return json.dumps({"time": when, "level": record.levelname, "logger": record.name,
                               "message": record.getMessage()})
        if access is not None:
            status = "-" if access.status is None else access.status
            return f"{when} {access.client} \"{access.method} {access.path}\" {status} {access.duration_ms:.0f} ms"
        if banner is not None:
            return banner_text(banner)
        return f"{record.levelname} {record.name}: {record.getMessage()}"


def banner_text(banner: Banner) -> str:
    lines = [f"oasr serve: {banner.model} on {banner.device} ({banner.engine}) is ready at {banner.url}"]
    width = max(len(route_url(banner.url, method, path)) for method, path, _ in BANNER_ROUTES)
    for method, path, what in BANNER_ROUTES:
        lines.append(f"  {method:4s} {route_url(banner.url, method, path):{width}s}  {what}")
    lines.append("Press Ctrl-C to stop; each request is logged below (--log-format json for JSON lines).")
    return "\n".join(lines)


class _CurrentStderr(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record comes, not the one there when the server started (a
    test runner or a daemon may replace and close the first)."""

    @property
    def stream(self) -> TextIO:  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:
        pass


def show_server_log(log_format: LogFormat, stream: TextIO | None = None) -> None:
    """Prints the banner and the access log on ``stream`` (stderr, as it is when each record comes) at INFO,
    past the root logger's level, and not also through the root's handlers."""
    handler = logging.StreamHandler(stream) if stream is not None else _CurrentStderr()
    handler.setFormatter(ServerLogFormatter(log_format))
    log.handlers[:] = [handler]
    log.setLevel(logging.INFO)
    log.propagate = False


def log_banner(banner: Banner) -> None:
    log.info("ready", extra={"banner": banner})


class AccessLogMiddleware:
    """Logs each HTTP request when its response has been sent (or it failed), and each WebSocket session when
    it closes: method, path, status, duration, client. Outermost, so that requests other middleware answer
    (a wrong Host, a CORS preflight) are logged too."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status: int | None = None

        async def send_noting_status(message) -> None:
            nonlocal status
            kind = message["type"]
            if kind in ("http.response.start", "websocket.http.response.start"):
                status = message["status"]
            elif kind == "websocket.accept":
                status = 101
            elif kind == "websocket.close" and status is None:
                status = 403  # closed before it was accepted: uvicorn answers the handshake with 403
            await send(message)

        try:
            await self.app(scope, receive, send_noting_status)
        except Exception:
            status = status or 500  # what the server answers for an error nothing handled
            raise
        finally:
            if log.isEnabledFor(logging.INFO):
                client = scope.get("client")
                method = "WS" if scope["type"] == "websocket" else scope.get("method", "-")
                record = AccessRecord(client[0] if client else "-", method, scope.get("path", ""), status,
                                      round((time.perf_counter() - started) * 1000, 1))
                log.info("%s %s %s", method, record.path, status, extra={"access": record})
