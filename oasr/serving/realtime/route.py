"""``GET /v1/realtime?intent=transcription``: the WebSocket handshake's checks, then one session.

Before the socket is accepted: the API key (as /v1's HTTP routes check it; a browser, which cannot set headers
here, offers it as a subprotocol), the intent, the page's Origin (a browser page may open a socket to any site it
likes; only the server's own page at ``/`` and origins allowed for CORS may) and the session cap.
The session caps are the server's, the client's (peer address) and the API key's (``RealtimeService.open_session``).
A refusal is answered as an HTTP response in OpenAI's error shape where the server supports that (uvicorn's
``websocket.http.response`` extension), else by closing the handshake (403).
"""

from __future__ import annotations

import logging

from fastapi import APIRouter
from starlette.responses import JSONResponse
from starlette.websockets import WebSocket

from oasr.serving.auth import REALTIME_SUBPROTOCOL, api_key_index, websocket_authorization
from oasr.serving.protocol import APIError
from oasr.serving.realtime.connection import RealtimeConnection, RealtimeService
from oasr.serving.settings import ANY_HOST

log = logging.getLogger(__name__)
_CLOSE_POLICY_VIOLATION = 1008
_BETA_SUBPROTOCOL = "openai-beta.realtime-v1"  # a browser's way to say ``OpenAI-Beta: realtime=v1``


def realtime_service(websocket: WebSocket) -> RealtimeService:
    return websocket.app.state.realtime


def add_realtime_route(router: APIRouter) -> None:
    @router.websocket("/v1/realtime")
    async def realtime(websocket: WebSocket) -> None:
        service = realtime_service(websocket)
        try:
            api_key = _admit(websocket, service)
            place = service.open_session(websocket.client.host if websocket.client else "", api_key)
        except APIError as exc:
            await _refuse(websocket, exc)
            return
        offered = list(websocket.scope.get("subprotocols", []))
        beta = ("realtime=v1" in websocket.headers.get("openai-beta", "").replace(" ", "")
                or _BETA_SUBPROTOCOL in offered)
        service.serving.metrics.realtime_sessions.inc()
        try:
            # A browser that offered subprotocols drops a socket whose answer names none of them.
            await websocket.accept(REALTIME_SUBPROTOCOL if REALTIME_SUBPROTOCOL in offered else None)
            await RealtimeConnection(websocket, service, "beta" if beta else "ga", api_key).run()
        finally:
            place.release()
            service.serving.metrics.realtime_sessions.dec()


def _admit(websocket: WebSocket, service: RealtimeService) -> int | None:
    settings = service.serving.settings
    authorization = websocket_authorization(websocket.headers.get("authorization", ""),
                                            list(websocket.scope.get("subprotocols", [])))
    api_key = api_key_index(authorization, settings.api_keys)
    intent = websocket.query_params.get("intent")
    if intent != "transcription":
        raise APIError(400, "This server serves transcription sessions only: connect to "
                       "/v1/realtime?intent=transcription.", param="intent", code="unsupported_intent")
    origin = websocket.headers.get("origin")
    if origin is not None and not _origin_allowed(origin, websocket.headers.get("host", ""),
                                                  settings.cors_allow_origins):
        raise APIError(403, f"Origin '{origin[:128]}' may not open realtime sessions here "
                       "(oasr serve --cors-allow-origin).", code="origin_not_allowed")
    return api_key


def _origin_allowed(origin: str, host: str, cors_allow_origins: tuple[str, ...]) -> bool:
    """An origin allowed for CORS, or the name and port the socket is opened to: the server's own page. A page
    of another site names that site in Origin; one that rebinds its name to this server is what the Host check
    (``hosts.py``) refuses, as it does for that page's same-origin HTTP calls."""
    if ANY_HOST in cors_allow_origins or origin in cors_allow_origins:
        return True
    _, _, netloc = origin.partition("://")
    return bool(host) and netloc.lower() == host.strip().lower()


async def _refuse(websocket: WebSocket, error: APIError) -> None:
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        await websocket.send_denial_response(JSONResponse(error.body(), status_code=error.status,
                                                          headers=error.headers))
    else:
        await websocket.close(_CLOSE_POLICY_VIOLATION, reason=error.message[:120])
