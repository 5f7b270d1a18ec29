"""``GET /``: the server's own page (live captions from the microphone, and file transcription), and the few
static files it loads from ``/static/``. They ship in the package (``oasr/serving/static/``), are plain HTML,
CSS and JavaScript with no build step, and load nothing from elsewhere. The page needs no API key to load; the
calls it makes to /v1 do, and it sends the key typed into it.
"""

from __future__ import annotations

from importlib import resources
from types import MappingProxyType

from fastapi import APIRouter
from starlette.responses import Response

from oasr.serving.protocol import APIError

# Each file the page may load, with its media type; nothing else under static/ is served.
STATIC_FILES = MappingProxyType({
    "index.html": "text/html; charset=utf-8",
    "page.css": "text/css; charset=utf-8",
    "page.js": "text/javascript; charset=utf-8",
    "capture-worklet.js": "text/javascript; charset=utf-8",
})
# Scripts, styles and sockets from this server only; the page is never framed by another site.
_HEADERS = MappingProxyType({
    "Content-Security-Policy": "default-src 'self'; connect-src 'self'; img-src 'self' data:; "
                               "frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
})


def static_file(name: str) -> Response:
    if name not in STATIC_FILES:
        raise APIError(404, f"Unknown request URL: GET /static/{name[:128]}.")
    body = resources.files("oasr.serving").joinpath("static", name).read_bytes()
    return Response(body, media_type=STATIC_FILES[name], headers=dict(_HEADERS))


def add_page_routes(router: APIRouter) -> None:
    @router.get("/", include_in_schema=False)
    async def page() -> Response:
        return static_file("index.html")

    @router.get("/static/{name}", include_in_schema=False)
    async def static(name: str) -> Response:
        return static_file(name)
