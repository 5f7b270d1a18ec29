"""Connections under uvicorn, with the two bounds it lacks on a request head: it must arrive within
``header_timeout_s``, and take no more than ``max_head_bytes``; and with a lingering close where uvicorn closes
at once.

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
plus one chunk; a chunk that ends a head and carries the start of its body is not counted either.

Each of those answers, like the app's 408 for a body too slow and any answer uvicorn ends the connection after,
may leave the client still sending. Closing a socket with bytes of the client's unread makes Linux send a reset
instead of a FIN, and a client whose TCP stack gets the reset before its program has read the answer loses the
answer. So the protocol hands uvicorn a ``LingeringTransport``: uvicorn closes through the transport its protocol
holds, after a response that ends the connection, on an error, at shutdown, and such a close lingers when a
request is partly received (``HeadTimeoutProtocol.may_be_sending``): the server stops sending (the answer, then
a FIN), reads and drops what still arrives, and closes when the client closes its end or after
``CLOSE_LINGER_S`` at most. A close between requests (the keep-alive timeout, a shutdown of an idle connection)
leaves nothing unread and stays immediate, and a lingering connection keeps a graceful shutdown waiting no
longer than the linger.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from oasr.serving.settings import ServerSettings

log = logging.getLogger(__name__)
GRACEFUL_SHUTDOWN_S = 5  # open streams get this long to finish on Ctrl-C / SIGTERM
# A connection the server closes while its client may still be sending is closed at most this long after the
# server's last byte: long enough for an answer to cross any network and its client to close, short enough that a
# client that never stops sending holds the connection (and a graceful shutdown) only this much longer.
CLOSE_LINGER_S = 2.0
_HEAD_TIMEOUT_TEXT = b"The request head was not received in time."
_HEAD_TOO_LARGE_TEXT = b"The request head (request line and headers) is larger than this server accepts."


def _closing_response(status: bytes, text: bytes) -> bytes:
    return (b"HTTP/1.1 %s\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: %d\r\n"
            b"connection: close\r\n\r\n%s" % (status, len(text), text))


_HEAD_TIMEOUT_RESPONSE = _closing_response(b"408 Request Timeout", _HEAD_TIMEOUT_TEXT)
_HEAD_TOO_LARGE_RESPONSE = _closing_response(b"431 Request Header Fields Too Large", _HEAD_TOO_LARGE_TEXT)


class LingeringTransport:
    """A connection's socket transport as uvicorn's protocol and its request cycles hold it, so that every close
    they decide on comes here. ``close`` closes at once when ``may_be_sending`` says the client is between
    requests; otherwise the connection lingers (``linger``). Any other call is the socket transport's."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop, linger_s: float,
                 may_be_sending: Callable[[], bool]) -> None:
        self.socket_transport = transport
        self.loop = loop
        self.linger_s = linger_s
        self.may_be_sending = may_be_sending
        self.lingering = False  # sending is over: what arrives is dropped until the client or the timer closes
        self.linger_timer: asyncio.TimerHandle | None = None

    def __getattr__(self, name: str):  # get_extra_info, resume_reading, can_write_eof ... of the socket
        return getattr(self.socket_transport, name)

    def close(self) -> None:
        if self.lingering:
            return  # the client's EOF (which the socket transport answers with a close) or the deadline closes it
        if self.may_be_sending():
            self.linger()
        else:
            self.socket_transport.close()

    def linger(self) -> None:
        """Stops sending (what was written still goes out, then a FIN), reads and drops what the client still
        sends, and closes when the client closes its end or after ``linger_s``. Closing with the client's bytes
        unread would send a reset, which may make the client's TCP stack drop the answer before it is read."""
        if self.lingering or self.socket_transport.is_closing():
            return
        self.lingering = True
        if self.socket_transport.can_write_eof():
            self.socket_transport.write_eof()
        self.socket_transport.resume_reading()  # flow control may have paused reading: bytes left unread reset
        self.linger_timer = self.loop.call_later(self.linger_s, self.socket_transport.close)

    def stop_lingering(self) -> None:  # the connection is gone
        if self.linger_timer is not None:
            self.linger_timer.cancel()
            self.linger_timer = None

    def is_closing(self) -> bool:  # uvicorn then starts no pipelined request and arms no keep-alive timer
        return self.lingering or self.socket_transport.is_closing()


class HeadTimeoutProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, closing connections whose request head takes over ``head_timeout_s``
    (408) or over ``max_head_bytes`` (431), and lingering over every close that may cut a request short."""

    def __init__(self, *args, head_timeout_s: float, max_head_bytes: int, linger_s: float = CLOSE_LINGER_S,
                 **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.head_timeout_s = head_timeout_s
        self.head_timer: asyncio.TimerHandle | None = None
        self.max_head_bytes = max_head_bytes
        self.in_head = True  # a new connection's first bytes are a head
        self.num_heads = 0  # heads begun on this connection, to tell one head from the next within a chunk
        self.num_head_bytes = 0  # bytes of the current head counted so far
        self.linger_s = linger_s
        self.lingering_transport: LingeringTransport | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        # uvicorn builds every request cycle with the protocol's transport, and closes through it after a response
        # that ends the connection (``Connection: close``, an error, shutdown): the closes this one lingers over.
        self.lingering_transport = LingeringTransport(transport, self.loop, self.linger_s, self.may_be_sending)
        super().connection_made(self.lingering_transport)  # type: ignore[arg-type]
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self.lingering_transport is not None:
            self.lingering_transport.stop_lingering()
        super().connection_lost(exc)

    def may_be_sending(self) -> bool:
        """Whether the client is within a request: some of its head has arrived, or its head and not all of its
        body, or a pipelined request waits (unread, as reading pauses for it). A connection that opened and got no
        byte, or is idle between requests, is not: closing it at once leaves nothing unread."""
        head_begun = self.in_head and self.num_heads > 0
        body_unended = self.cycle is not None and self.cycle.more_body
        return head_begun or body_unended or bool(self.pipeline)

    def data_received(self, data: bytes) -> None:
        if self.lingering_transport is not None and self.lingering_transport.lingering:
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
        self._disarm()
        self.transport.write(_HEAD_TOO_LARGE_RESPONSE)
        assert self.lingering_transport is not None
        self.lingering_transport.linger()  # also for a "head" of blank lines, where no request has begun

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
        self.transport.close()  # lingers when part of a head arrived


def uvicorn_config(app, settings: ServerSettings, **kwargs) -> uvicorn.Config:
    """uvicorn's config for ``app`` under ``settings``: the head deadline and size, the graceful shutdown; ``kwargs``
    (host, port, log_level ...) as ``uvicorn.Config`` takes them."""
    kwargs.setdefault("timeout_graceful_shutdown", GRACEFUL_SHUTDOWN_S)
    # Realtime frames up to this size are read, so that an event over the event limit is answered, not cut off.
    kwargs.setdefault("ws_max_size", settings.realtime.max_frame_bytes)
    http = functools.partial(HeadTimeoutProtocol, head_timeout_s=settings.header_timeout_s,
                             max_head_bytes=settings.max_head_bytes)
    return uvicorn.Config(app, http=http, **kwargs)  # type: ignore[arg-type]
