"""The API-key check every /v1 route makes, HTTP and WebSocket alike, and the API description makes too."""

from __future__ import annotations

import hmac

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from oasr.serving.protocol import APIError

# FastAPI serves the API's description from a route of its own, outside /v1 and its key check.
KEYED_DOCUMENTS = ("/openapi.json",)

# A browser cannot set headers on a WebSocket, only the subprotocols it offers; OpenAI's browser clients offer
# the key as one of them, with "realtime" beside it (the one the server then picks).
KEY_SUBPROTOCOL_PREFIX = "openai-insecure-api-key."
REALTIME_SUBPROTOCOL = "realtime"


def api_key_index(authorization: str, keys: tuple[str, ...]) -> int | None:
    """The index of the key an ``Authorization`` header carries (None when ``keys`` is empty: an open server);
    raises the 401 ``APIError`` when it carries none of them. HTTP routes and the realtime socket share it."""
    if not keys:
        return None
    scheme, _, given = authorization.partition(" ")
    if scheme.lower() == "bearer":
        # Every key is compared (in constant time each), so the time taken tells nothing about which matched.
        matches = [hmac.compare_digest(given.strip().encode(), key.encode()) for key in keys]
        if any(matches):
            return matches.index(True)
    raise APIError(401, "Incorrect or missing API key: send 'Authorization: Bearer <key>' (from a browser's "
                   f"WebSocket: the subprotocol '{KEY_SUBPROTOCOL_PREFIX}<key>').",
                   code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


def websocket_authorization(authorization: str, subprotocols: list[str]) -> str:
    """The ``Authorization`` a WebSocket handshake stands for: its header, else the key a browser offers as the
    subprotocol ``openai-insecure-api-key.<KEY>``, read as ``Bearer <KEY>`` (empty when neither is there)."""
    if authorization:
        return authorization
    for name in subprotocols:
        if name.startswith(KEY_SUBPROTOCOL_PREFIX):
            return f"Bearer {name[len(KEY_SUBPROTOCOL_PREFIX):]}"
    return ""


class KeyedDocumentsMiddleware:
    """On a server with API keys, ``/openapi.json`` (every route, form field and limit of the API) needs a key
    as /v1 does; a keyless server serves it to anyone. /health, /metrics and the page stay open."""

    def __init__(self, app: ASGIApp, keys: tuple[str, ...], paths: tuple[str, ...] = KEYED_DOCUMENTS) -> None:
        self.app = app
        self.keys = keys
        self.paths = paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.keys and scope["type"] == "http" and scope["path"] in self.paths:
            try:
                api_key_index(Headers(scope=scope).get("authorization", ""), self.keys)
            except APIError as exc:
                await JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)(scope, receive, send)
                return
        await self.app(scope, receive, send)
