"""``POST /v1/audio/diarization``: a multipart ``file`` in, JSON speaker segments out
(``{"model", "duration", "segments": [{"start", "end", "speaker"}]}``, speakers ``speaker_0``, ``speaker_1``, ...
in order of first arrival).

The diarization model does not run in the engine core: ``DiarizationService`` is an engine object of its own
in the HTTP process, loaded on the first request (torch with it) and run one request at a time on a worker
thread, so the event loop keeps answering. A server started without ``--diarization-model`` answers 404.
"""

from __future__ import annotations

import asyncio
import os
import threading
from typing import TYPE_CHECKING

from fastapi import APIRouter, Request
from pydantic import BaseModel
from starlette.responses import JSONResponse, Response

from oasr.errors import AudioDecodeError, AudioTooLongError, OASRError
from oasr.serving.protocol import APIError
from oasr.serving.upload import read_form, split_form

if TYPE_CHECKING:
    from oasr.diarization.offline import OfflineDiarizer
    from oasr.diarization.types import Diarization, SpeakerSegment
    from oasr.serving.settings import ServerSettings

_FIELDS = ("model", "threshold")


class DiarizationSegment(BaseModel):
    start: float
    end: float
    speaker: str


class DiarizationResponse(BaseModel):
    model: str
    duration: float
    segments: list[DiarizationSegment]


class DiarizationService:
    """One diarization checkpoint, loaded once on first use, run one request at a time."""

    def __init__(self, model: str, device: str = "auto") -> None:
        self.model, self.device = model, device
        self.name = os.path.basename(os.path.normpath(model)) if os.path.isdir(model) else model
        self._lock = threading.Lock()
        self._diarizer: OfflineDiarizer | None = None

    def diarize(self, audio, source: str, threshold: float = 0.5) -> Diarization:
        from oasr.diarization.loader import load_diarizer
        from oasr.diarization.offline import OfflineDiarizer

        with self._lock:
            if self._diarizer is None:
                self._diarizer = OfflineDiarizer(load_diarizer(self.model, device=self.device))
            self._diarizer.threshold = threshold
            return self._diarizer.diarize([audio], [source])[0]


async def diarize_within(service: DiarizationService, audio, source: str, deadline: float
                         ) -> tuple[SpeakerSegment, ...]:
    """Who speaks when in ``audio`` (a transcription's speakers), on a worker thread, by the event loop's
    ``deadline`` (``TimeoutError`` after it). A model that fails to load is the server's fault: a 500 that
    says so."""
    timeout = deadline - asyncio.get_running_loop().time()
    if timeout <= 0:
        raise TimeoutError
    try:
        result = await asyncio.wait_for(asyncio.to_thread(service.diarize, audio, source), timeout)
    except OASRError as exc:
        raise APIError(500, f"The diarization model could not be loaded: {exc}", type="server_error") from None
    return result.segments


def _threshold(fields: dict[str, object]) -> float:
    text = fields.get("threshold", "0.5")
    try:
        value = float(str(text))
    except ValueError:
        value = -1.0
    if not 0.0 < value < 1.0:
        raise APIError(400, f"Invalid value for 'threshold': {str(text)[:32]!r}; it must lie between 0 and 1.",
                       param="threshold")
    return value


async def diarize_upload(request: Request, service: DiarizationService | None, settings: ServerSettings) -> Response:
    if service is None:
        raise APIError(404, "This server serves no diarization model; start it with --diarization-model.",
                       code="model_not_found")
    form = await read_form(request, settings.max_upload_bytes, settings.body_timeout_s)
    upload, fields = split_form(form)
    unknown = sorted(set(fields) - set(_FIELDS))
    if unknown:
        raise APIError(400, f"Unknown parameter: '{unknown[0][:64]}'.", param=unknown[0][:64])
    if "model" in fields and fields["model"] != service.name:
        raise APIError(404, f"The diarization model `{str(fields['model'])[:128]}` does not exist; this server "
                       f"serves `{service.name}`.", param="model", code="model_not_found")
    threshold = _threshold(fields)
    from oasr.transcription.spans import to_samples

    source = os.path.basename(upload.filename or "")[:200] or "file"
    data = await upload.read()
    limit = settings.max_audio_seconds
    try:
        audio = await asyncio.to_thread(to_samples, data, source, limit)
    except AudioTooLongError as exc:
        raise APIError(400, f"{source}: {exc.length}; this server accepts at most {limit:g} s.", param="file",
                       code="audio_too_long") from None
    except AudioDecodeError as exc:
        raise APIError(400, f"Could not read the audio: {exc}", param="file", code="invalid_audio") from None
    try:
        result = await asyncio.to_thread(service.diarize, audio, source, threshold)
    except OASRError as exc:  # the checkpoint failed to load: the server's fault, said plainly
        raise APIError(500, f"The diarization model could not be loaded: {exc}", type="server_error") from None
    body = DiarizationResponse(model=service.name, duration=round(result.duration, 3),
                               segments=[DiarizationSegment(start=s.start, end=s.end, speaker=s.label)
                                         for s in result.segments])
    return JSONResponse(body.model_dump())


def add_diarization_route(v1: APIRouter) -> None:
    """Adds the route to the /v1 router (which checks the API key)."""

    @v1.post("/audio/diarization", summary="Who speaks when: speaker segments of an uploaded file (multipart)",
             response_model=DiarizationResponse)
    async def create_diarization(request: Request) -> Response:
        return await diarize_upload(request, request.app.state.diarization, request.app.state.serving.settings)
