"""Connections under uvicorn, with the two bounds it lacks on a request head: it must arrive within
``header_timeout_s``, and take no more than ``max_head_bytes``.

uvicorn (its httptools protocol) times out a kept-alive connection that stays idle after a response
(``timeout_keep_alive``), but nothing else: that timer is cancelled by the next request's first byte, and a new
connection has none. A client could hold any number of connections by sending a header line now and then, or
nothing at all (slowloris). ``HeadTimeoutProtocol`` arms a timer when a connection opens and when a later
request on it begins, and disarms it when the request's headers are complete; past it the connection is
answered 408 and closed. Bodies are timed by the app (``read_form``, ``body_timeout_s``), where the 408 can be
an OpenAI-shaped error; the app sees a request only once its headers are complete.

Nor does httptools bound a head's size: it gathers a header line whole before handing it over, so one header of
100 MB costs the server that much and more. ``HeadTimeoutProtocol`` counts the bytes that arrive while a head is
incomplete and past ``max_head_bytes`` answers 431 and closes the connection. A chunk read from the socket
(at most 256 KiB) in which a head begins is not counted, so what a head can make the parser hold is the limit
plus one chunk; a chunk that ends a head and carries the start of its body is not counted either. The 431 is
followed by a lingering close: the server stops sending, reads and drops what the client still sends for up to
``REFUSED_LINGER_S``, then closes. Closing at once, with the client's bytes unread, would send a reset that
makes the client's TCP stack drop the 431 before the client has read it.
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
REFUSED_LINGER_S = 2.0  # a connection refused for its head's size is closed this long after its 431 at most
_HEAD_TIMEOUT_TEXT = b"The request head was not received in time."
_HEAD_TOO_LARGE_TEXT = b"The request head (request line and headers) is larger than this server accepts."


def _closing_response(status: bytes, text: bytes) -> bytes:
    return (b"HTTP/1.1 %s\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: %d\r\n"
            b"connection: close\r\n\r\n%s" % (status, len(text), text))


_HEAD_TIMEOUT_RESPONSE = _closing_response(b"408 Request Timeout", _HEAD_TIMEOUT_TEXT)
_HEAD_TOO_LARGE_RESPONSE = _closing_response(b"431 Request Header Fields Too Large", _HEAD_TOO_LARGE_TEXT)


class HeadTimeoutProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, closing connections whose request head takes over ``head_timeout_s``
    (408) or over ``max_head_bytes`` (431)."""

    def __init__(self, *args, head_timeout_s: float, max_head_bytes: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.head_timeout_s = head_timeout_s
        self.head_timer: asyncio.TimerHandle | None = None
        self.max_head_bytes = max_head_bytes
        self.in_head = True  # a new connection's first bytes are a head
        self.num_heads = 0  # heads begun on this connection, to tell one head from the next within a chunk
        self.num_head_bytes = 0  # bytes of the current head counted so far
        self.refused = False  # answered 431: what still arrives is dropped until the connection closes

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return
        head_before = self.num_heads if self.in_head else None
        super().data_received(data)
        # Counted only when the whole chunk belongs to one head: it was open before the chunk and still is.
        if head_before is None or not self.in_head or self.num_heads != head_before or self.transport.is_closing():
            return
        self.num_head_bytes += len(data)
        if self.num_head_bytes > self.max_head_bytes:
            log.info("closing a connection from %s: its request head passed %d bytes", self.client,
                     self.max_head_bytes)
            self._refuse_head()

    def _refuse_head(self) -> None:
        self.refused = True
        self._disarm()
        self.transport.write(_HEAD_TOO_LARGE_RESPONSE)
        if self.transport.can_write_eof():
            self.transport.write_eof()  # the client's end of the exchange; its own end closes the connection
        self.loop.call_later(REFUSED_LINGER_S, self.transport.close)

    def on_message_begin(self) -> None:  # the parser met a request's first byte
        super().on_message_begin()
        self.in_head, self.num_heads, self.num_head_bytes = True, self.num_heads + 1, 0
        if self.head_timer is None:
            self._arm()

    def on_headers_complete(self) -> None:
        self.in_head = False
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
    """uvicorn's config for ``app`` under ``settings``: the head deadline and size, the graceful shutdown; ``kwargs``
    (host, port, log_level ...) as ``uvicorn.Config`` takes them."""
    kwargs.setdefault("timeout_graceful_shutdown", GRACEFUL_SHUTDOWN_S)
    # Realtime frames up to this size are read, so that an event over the event limit is answered, not cut off.
    kwargs.setdefault("ws_max_size", settings.realtime.max_frame_bytes)
    http = functools.partial(HeadTimeoutProtocol, head_timeout_s=settings.header_timeout_s,
                             max_head_bytes=settings.max_head_bytes)
    return uvicorn.Config(app, http=http, **kwargs)  # type: ignore[arg-type]
