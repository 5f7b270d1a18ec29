"""``POST /v1/audio/diarization``: a multipart ``file`` in, JSON speaker segments out
(``{"model", "duration", "segments": [{"start", "end", "speaker"}]}``, speakers ``speaker_0``, ``speaker_1``, ...
in order of first arrival).

``DiarizationService`` sends each diarization to the engine core when the core serves the model beside the ASR
model (``oasr serve`` starts it so); elsewhere (Ray replicas) it is an engine object of its own in the HTTP
process, loaded on the first request (torch with it) and run on worker threads, requests that arrive together
batched, so the event loop keeps answering. A server started without ``--diarization-model`` answers 404.
"""

from __future__ import annotations

import asyncio
import os
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from fastapi import APIRouter, Request
from pydantic import BaseModel
from starlette.responses import JSONResponse, Response

from oasr.errors import AudioDecodeError, AudioTooLongError, OASRError
from oasr.hosting.relay import EngineDeadError
from oasr.serving.protocol import APIError
from oasr.serving.upload import read_form, split_form

if TYPE_CHECKING:
    from oasr.diarization.offline import OfflineDiarizer
    from oasr.diarization.types import Diarization, SpeakerSegment
    from oasr.hosting.engine_client import EngineClient
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


@dataclass
class _Pending:
    """One request waiting for the diarizer (``done`` set once ``result`` or ``error`` is)."""

    audio: np.ndarray
    source: str
    threshold: float
    done: threading.Event = field(default_factory=threading.Event)
    result: Diarization | None = None
    error: BaseException | None = None


class DiarizationService:
    """One diarization checkpoint, loaded once on first use. Requests that arrive while the model runs are
    diarized together in its next run, batched (``OfflineDiarizer``: a row's result never depends on its batch):
    each caller queues its request, and whichever caller gets the model next runs everything queued by then,
    its own request and the others', so there is no thread of its own to start or stop."""

    def __init__(self, model: str, device: str = "auto", engine: EngineClient | None = None) -> None:
        self.model, self.device = model, device
        # The engine core serves the model itself (``oasr serve`` starts it so): requests go there, batched with
        # those of every API worker, and this process never loads it.
        self.engine = engine if engine is not None and engine.diarization_model is not None else None
        self.name = os.path.basename(os.path.normpath(model)) if os.path.isdir(model) else model
        self._run_lock = threading.Lock()  # held by the caller running a batch
        self._queue_lock = threading.Lock()
        self._queued: list[_Pending] = []
        self._diarizer: OfflineDiarizer | None = None
        self.batch_sizes: list[int] = []  # of each run, for tests and logs: a batching that never batches shows

    async def run(self, audio: np.ndarray, source: str, threshold: float = 0.5) -> Diarization:
        """``audio`` diarized in the engine core where it serves the model, else here on a worker thread."""
        if self.engine is not None:
            segments = await self.engine.diarize(audio, threshold)
            from oasr.diarization.types import Diarization

            return Diarization(source, len(audio) / 16000, tuple(segments))
        return await asyncio.to_thread(self.diarize, audio, source, threshold)

    def diarize(self, audio, source: str, threshold: float = 0.5) -> Diarization:
        """Blocks until ``audio`` is diarized in this process (call it from a worker thread)."""
        pending = _Pending(audio, source, threshold)
        with self._queue_lock:
            self._queued.append(pending)
        with self._run_lock:
            if not pending.done.is_set():  # nobody ran it meanwhile: this caller runs the queue
                with self._queue_lock:
                    batch, self._queued = self._queued, []
                self._run(batch)
        if pending.error is not None:
            raise pending.error
        assert pending.result is not None
        return pending.result

    def _run(self, batch: list[_Pending]) -> None:
        from oasr.diarization.segments import speaker_segments
        from oasr.diarization.types import Diarization

        try:
            diarizer = self._loaded()
            probs = diarizer.probabilities([p.audio for p in batch])
            self.batch_sizes.append(len(batch))
            frame_s = diarizer.loaded.frame_seconds
            for p, rows in zip(batch, probs, strict=True):
                p.result = Diarization(p.source, len(p.audio) / 16000,
                                       speaker_segments(rows, frame_s, p.threshold))
        except BaseException as exc:  # each waiting caller raises it (a model that failed to load, say)
            for p in batch:
                p.error = exc
        finally:
            for p in batch:
                p.done.set()

    def _loaded(self) -> OfflineDiarizer:
        if self._diarizer is None:
            from oasr.diarization.loader import load_diarizer
            from oasr.diarization.offline import OfflineDiarizer

            self._diarizer = OfflineDiarizer(load_diarizer(self.model, device=self.device))
        return self._diarizer


def check_diarized(task: str, service: DiarizationService | None) -> None:
    """Refuses ``response_format=diarized_json`` where it cannot be answered."""
    if task != "transcribe":
        raise APIError(400, "response_format 'diarized_json' labels the speakers of a transcription; "
                       "translations have none.", param="response_format", code="unsupported_value")
    if service is None:
        raise APIError(400, "response_format 'diarized_json' needs a diarization model, and this server has "
                       "none: start it with --diarization-model ID, or ask for another response_format.",
                       param="response_format", code="unsupported_value")


async def diarize_within(service: DiarizationService, audio, source: str, deadline: float
                         ) -> tuple[SpeakerSegment, ...]:
    """Who speaks when in ``audio`` (a transcription's speakers), by the event loop's ``deadline``
    (``TimeoutError`` after it). A model that fails (to load, say) is the server's fault: a 500 that says so; an
    engine core that stopped raises ``EngineDeadError``, as the transcription would."""
    timeout = deadline - asyncio.get_running_loop().time()
    if timeout <= 0:
        raise TimeoutError
    try:
        result = await asyncio.wait_for(service.run(audio, source), timeout)
    except EngineDeadError:
        raise
    except OASRError as exc:
        raise APIError(500, f"The diarization model failed: {exc}", type="server_error") from None
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
        result = await service.run(audio, source, threshold)
    except EngineDeadError:
        raise APIError(503, "The engine has stopped; this server cannot diarize.", type="server_error",
                       code="engine_unavailable") from None
    except OASRError as exc:  # the checkpoint failed to load, say: the server's fault, said plainly
        raise APIError(500, f"The diarization model failed: {exc}", type="server_error") from None
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
