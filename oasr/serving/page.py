"""``GET /``: the server's own page (live captions from the microphone, and file transcription), and the few
static files it loads from ``/static/``. They ship in the package (``oasr/serving/static/``), are plain HTML,
CSS and JavaScript with no build step, and load nothing from elsewhere. The page needs no API key to load; the
calls it makes to /v1 do, and it sends the key typed into it.
"""

from __future__ import annotations

from importlib import resources
from types import MappingProxyType

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from oasr.errors import UnsupportedOptionError
from oasr.serving.languages import openai_language_name
from oasr.serving.protocol import APIError
from oasr.types import DecodeOptions

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

    @router.get("/page/config", include_in_schema=False)
    async def page_config(request: Request) -> Response:
        return JSONResponse(await page_config_of(request.app.state.serving), headers=dict(_HEADERS))


async def page_config_of(serving) -> dict[str, object]:
    """What the page offers: the model it talks to (the name /health shows too, so no key is needed), the
    languages a user may pick (none for a model of one language), translation into English where the model
    serves it, and whether captions stream while someone speaks. What the model serves is asked of the engine,
    as a request's options would be (an English-only Whisper shares its architecture with multilingual ones)."""
    capabilities = serving.engine.capabilities
    codes = _languages(serving.engine.tokenizer) if "language" in capabilities.options else ()
    if len(codes) < 2 or not await _serves(serving, DecodeOptions(language=codes[1])):
        codes = ()
    translate = "translate" in capabilities.tasks and await _serves(serving, DecodeOptions(task="translate"))
    return {
        "model": serving.settings.served_model_name,
        "languages": [{"code": code, "name": openai_language_name(code).title()} for code in codes],
        "translate": translate,
        "streaming": capabilities.streaming is not None,
    }


async def _serves(serving, options: DecodeOptions) -> bool:
    try:
        await serving.engine.check(options)
    except UnsupportedOptionError:
        return False
    return True


def _languages(tokenizer) -> tuple[str, ...]:
    """The language codes a tokenizer knows, in its own order. Tokenizers do not share an interface for this
    yet: JSON tokenizers list ``languages``, Whisper's keeps them in ``special.language_ids``."""
    listed = getattr(tokenizer, "languages", None)
    if listed is not None:
        return tuple(listed)
    special = getattr(tokenizer, "special", None)
    return tuple(getattr(special, "language_ids", {}) or ())
