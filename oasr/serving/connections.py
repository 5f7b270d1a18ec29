"""Connections under uvicorn, with the deadline it lacks: a request head must arrive within ``header_timeout_s``.

uvicorn (its httptools protocol) times out a kept-alive connection that stays idle after a response
(``timeout_keep_alive``), but nothing else: that timer is cancelled by the next request's first byte, and a new
connection has none. A client could hold any number of connections by sending a header line now and then, or
nothing at all (slowloris). ``HeadTimeoutProtocol`` arms a timer when a connection opens and when a later
request on it begins, and disarms it when the request's headers are complete; past it the connection is
answered 408 and closed. Bodies are timed by the app (``read_form``, ``body_timeout_s``), where the 408 can be
an OpenAI-shaped error; the app sees a request only once its headers are complete.
"""

from __future__ import annotations

import asyncio
import functools
import logging

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from oasr.serving.settings import ServerSettings

log = logging.getLogger(__name__)
GRACEFUL_SHUTDOWN_S = 5  # open streams get this long to finish on Ctrl-C / SIGTERM
_HEAD_TIMEOUT_TEXT = b"The request head was not received in time."
_HEAD_TIMEOUT_RESPONSE = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
                          b"content-length: %d\r\nconnection: close\r\n\r\n%s"
                          % (len(_HEAD_TIMEOUT_TEXT), _HEAD_TIMEOUT_TEXT))


class HeadTimeoutProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, closing connections whose request head takes over ``head_timeout_s``."""

    def __init__(self, *args, head_timeout_s: float, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.head_timeout_s = head_timeout_s
        self.head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:  # the parser met a request's first byte
        super().on_message_begin()
        if self.head_timer is None:
            self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def _arm(self) -> None:
        self.head_timer = self.loop.call_later(self.head_timeout_s, self._head_timed_out)

    def _disarm(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None

    def _head_timed_out(self) -> None:
        self.head_timer = None
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.keep_alive = False  # a pipelined head behind a running request: close once it is answered
            return
        log.info("closing a connection from %s: no complete request head in %g s", self.client,
                 self.head_timeout_s)
        self.transport.write(_HEAD_TIMEOUT_RESPONSE)
        self.transport.close()


def uvicorn_config(app, settings: ServerSettings, **kwargs) -> uvicorn.Config:
    """uvicorn's config for ``app`` under ``settings``: the head deadline, the graceful shutdown; ``kwargs``
    (host, port, log_level ...) as ``uvicorn.Config`` takes them."""
    kwargs.setdefault("timeout_graceful_shutdown", GRACEFUL_SHUTDOWN_S)
    # Realtime frames up to this size are read, so that an event over the event limit is answered, not cut off.
    kwargs.setdefault("ws_max_size", settings.realtime.max_frame_bytes)
    http = functools.partial(HeadTimeoutProtocol, head_timeout_s=settings.header_timeout_s)
    return uvicorn.Config(app, http=http, **kwargs)  # type: ignore[arg-type]
