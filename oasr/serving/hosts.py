"""The Host header check: a server answers only the names it is reached by (``ServerSettings.allowed_hosts``).

A keyless server on loopback is reachable from any page a local browser opens: the page's site rebinds its
DNS name to 127.0.0.1 and its scripts call the server as same-origin. The request still carries the site's
name in Host, so a server that answers loopback names only (``oasr serve``'s default on a loopback address)
refuses it before any route runs, with a 400 in OpenAI's error shape.

A request with two Host headers is refused whatever the allowed names (RFC 9112 section 3.2 asks for a 400):
a proxy in front may route by one and the app read the other.
"""

from __future__ import annotations

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from oasr.serving.protocol import APIError
from oasr.serving.settings import ANY_HOST

_MAX_ECHOED_CHARS = 128  # of a refused Host named in the error


def host_name(header: str) -> str:
    """The name in a Host header, without its port or an IPv6 address's brackets, lowercased."""
    header = header.strip().lower()
    if header.startswith("["):
        end = header.find("]")
        return header[1:end] if end > 0 else header
    if header.count(":") == 1:  # name:port (a bare IPv6 address has more colons and no port)
        header = header.partition(":")[0]
    return header.rstrip(".")


def _normalized(pattern: str) -> str:
    return pattern.strip().lower().strip("[]").rstrip(".")


class AllowedHostsMiddleware:
    """Passes requests whose Host is one of ``allowed`` (exact names, ``*.suffix`` for subdomains, ``*`` for
    any); refuses the others, and requests without a Host."""

    def __init__(self, app: ASGIApp, allowed: tuple[str, ...]) -> None:
        self.app = app
        self.allowed = tuple(_normalized(p) for p in allowed)
        self.exact = {p for p in self.allowed if not p.startswith("*.")}
        self.suffixes = tuple(p[1:] for p in self.allowed if p.startswith("*."))

    def allows(self, name: str) -> bool:
        return name in self.exact or any(name.endswith(suffix) for suffix in self.suffixes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        hosts = [value.decode("latin-1") for key, value in scope["headers"] if key == b"host"]
        if len(hosts) > 1:
            await _refuse(scope, receive, send, "two host headers", APIError(
                400, f"The request has {len(hosts)} Host headers; send one.", code="invalid_host"))
            return
        header = hosts[0] if hosts else None
        if ANY_HOST in self.allowed or (header is not None and self.allows(host_name(header))):
            await self.app(scope, receive, send)
            return
        named = f"Host '{header[:_MAX_ECHOED_CHARS]}'" if header is not None else "A request without a Host header"
        await _refuse(scope, receive, send, "host not allowed", APIError(
            400, f"{named} is not served here; this server answers to {', '.join(self.allowed)} "
            "(oasr serve --allowed-hosts).", code="invalid_host"))


async def _refuse(scope: Scope, receive: Receive, send: Send, reason: str, error: APIError) -> None:
    """``error`` for an HTTP request; a WebSocket handshake is closed with ``reason``, which a close frame
    must keep short."""
    if scope["type"] == "websocket":  # closing before the accept refuses the handshake (403)
        await send({"type": "websocket.close", "code": 1008, "reason": reason})
        return
    await JSONResponse(error.body(), status_code=error.status)(scope, receive, send)
