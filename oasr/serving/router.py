"""The HTTP routes: each hands its request to the serving logic and returns what it answers."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from starlette.responses import JSONResponse, Response

from oasr import __version__
from oasr.serving.auth import api_key_index
from oasr.serving.lifecycle import ServerState
from oasr.serving.protocol import (
    APIError,
    ModelCard,
    ModelList,
    TranscriptionParams,
    TranslationParams,
    form_request_body,
)
from oasr.serving.diarization import add_diarization_route
from oasr.serving.page import add_page_routes
from oasr.serving.realtime.route import add_realtime_route
from oasr.serving.serving import OpenAIServingTranscription


def serving(request: Request) -> OpenAIServingTranscription:
    return request.app.state.serving


def require_api_key(request: Request) -> int | None:
    """With API keys configured, /v1/* needs ``Authorization: Bearer <key>``; checked before the upload is read.
    Returns the index of the key given (None on an open server): each key's open requests are capped."""
    return api_key_index(request.headers.get("authorization", ""), serving(request).settings.api_keys)


def build_router() -> APIRouter:
    v1 = APIRouter(prefix="/v1", dependencies=[Depends(require_api_key)])

    # The form is parsed by hand (within the upload limits, after the caps are checked), so its schema is declared.
    @v1.post("/audio/transcriptions", summary="Transcribe audio (OpenAI-compatible, multipart form)",
             openapi_extra=form_request_body(TranscriptionParams))
    async def create_transcription(request: Request, api_key: int | None = Depends(require_api_key)) -> Response:
        return await serving(request).create(request, "transcribe", api_key)

    @v1.post("/audio/translations", summary="Translate audio into English text (OpenAI-compatible)",
             openapi_extra=form_request_body(TranslationParams))
    async def create_translation(request: Request, api_key: int | None = Depends(require_api_key)) -> Response:
        return await serving(request).create(request, "translate", api_key)

    @v1.get("/models", summary="The served model")
    async def list_models(request: Request) -> ModelList:
        return ModelList(data=[_model_card(request)])

    @v1.get("/models/{model_id}", summary="One model, if served")
    async def retrieve_model(model_id: str, request: Request) -> ModelCard:
        if not serving(request).settings.accepts_model(model_id):
            raise APIError(404, f"The model `{model_id[:128]}` does not exist.", param="model",
                           code="model_not_found")
        return _model_card(request, model_id)

    add_diarization_route(v1)

    router = APIRouter()
    router.include_router(v1)
    # A WebSocket route takes no Request, so it checks the API key itself (the same check), before accepting.
    add_realtime_route(router)
    add_page_routes(router)  # outside /v1: the page itself loads without a key

    @router.get("/health", summary="The server's state: 200 when 'ok', 503 while 'starting', 'draining' or 'dead' "
                "(with replicas: ok while one is up)")
    async def health(request: Request) -> Response:
        state = request.app.state.lifecycle.state
        body: dict[str, object] = {"status": state.value, "model": serving(request).settings.served_model_name,
                                   "version": __version__}
        replicas = serving(request).engine.stats().replicas
        if replicas:
            body["replicas"] = {"up": sum(r.up for r in replicas), "total": len(replicas)}
        return JSONResponse(body, status_code=200 if state is ServerState.OK else 503)

    @router.get("/metrics", summary="Prometheus metrics")
    async def metrics(request: Request) -> Response:
        body, content_type = serving(request).metrics.exposition()
        return Response(body, media_type=content_type)

    return router


def _model_card(request: Request, model_id: str | None = None) -> ModelCard:
    return ModelCard(id=model_id or serving(request).settings.served_model_name, created=request.app.state.created)
