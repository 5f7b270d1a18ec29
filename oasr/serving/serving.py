"""The OpenAI audio endpoints' logic against an engine client: upload -> 30 s windows -> one engine request per
window, all at once -> one result, rendered in the asked format or streamed as text events.

Every way a request can end (answered, failed, timed out, client gone, stream closed) cancels its windows'
output iterators, which aborts their engine requests and frees their rows; admission is released with it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
import zlib
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from pydantic import ValidationError
from starlette.datastructures import FormData, UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from oasr.audio import SAMPLE_RATE, audio_duration
from oasr.engine.async_engine import EngineDeadError, EngineOverloadedError
from oasr.engine.offline import to_samples
from oasr.engine.request import RequestOutput
from oasr.errors import AudioDecodeError, UnsupportedOptionError
from oasr.engine.results import DecodedWindow, assemble, decoded_window
from oasr.serving.decoding import OrderedText, WindowedDecode
from oasr.serving.engine_client import EngineClient
from oasr.serving.formats import render
from oasr.serving.metrics import ServerMetrics
from oasr.serving.protocol import (
    APIError,
    TextDeltaEvent,
    TextDoneEvent,
    TranscriptionParams,
    TranscriptionResponse,
    TranslationParams,
    Usage,
    VerboseSegment,
    VerboseTranscriptionResponse,
    internal_error,
    validation_error,
)
from oasr.serving.settings import ServerSettings
from oasr.serving.sse import SSEResponse, sse_data
from oasr.serving.upload import ClientGone, read_form, split_form, wait_for_disconnect
from oasr.types import DecodeOptions, Segment, Task, Transcription

log = logging.getLogger(__name__)
T = TypeVar("T")

SAMPLES_PER_FRAME = SAMPLE_RATE // 100  # Whisper's 10 ms feature frames, in which ``seek`` counts
_MAX_NAME_CHARS = 128  # of a client's file or model name echoed back in errors
_TEXT_FORMATS = {"text": "txt", "srt": "srt", "vtt": "vtt"}
_STREAMED_FORMATS = ("json", "text")  # a stream carries text events; subtitles and segments need the end


class Ticket:
    """One admitted request's place; ``release`` is idempotent, so every way out may call it."""

    def __init__(self, admission: Admission) -> None:
        self._admission = admission
        self._released = False
        self.admitted_at = time.perf_counter()

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._admission.num_in_flight -= 1
            self._admission.on_change(self._admission.num_in_flight)


class Admission:
    """Transcription requests being served. Past ``limit`` new ones are refused at once (429 with
    Retry-After), before their upload is read, instead of queueing without bound. Used on the event loop only."""

    def __init__(self, limit: int, retry_after_s: int,
                 on_change: Callable[[int], None] = lambda num_in_flight: None) -> None:
        self.limit = limit
        self.retry_after_s = retry_after_s
        self.num_in_flight = 0
        self.on_change = on_change  # told the new count after every change (the metrics of several workers)

    def acquire(self) -> Ticket:
        if self.num_in_flight >= self.limit:
            raise busy(f"The server is serving its maximum of {self.limit} requests; retry shortly.",
                       self.retry_after_s)
        self.num_in_flight += 1
        self.on_change(self.num_in_flight)
        return Ticket(self)


def busy(message: str, retry_after_s: int) -> APIError:
    return APIError(429, message, type="rate_limit_error", code="server_busy",
                    headers={"Retry-After": str(retry_after_s)})


@dataclass(frozen=True)
class TranscriptionJob:
    task: Task
    params: TranslationParams  # a ``TranscriptionParams`` for the transcriptions route
    source: str  # the upload's file name, as the client gave it (safe to echo)
    audio: np.ndarray
    duration_s: float
    options: DecodeOptions
    ticket: Ticket
    deadline: float  # event-loop time (from admission) after which the request is aborted (504)

    @property
    def stream(self) -> bool:
        return isinstance(self.params, TranscriptionParams) and self.params.stream


@dataclass(frozen=True)
class TranscriptionResult:
    transcription: Transcription
    windows: list[DecodedWindow]


class OpenAIServingTranscription:
    def __init__(self, engine: EngineClient, settings: ServerSettings) -> None:
        self.engine = engine
        self.settings = settings
        self.tokenizer = engine.tokenizer
        self.admission = Admission(settings.max_in_flight, settings.retry_after_s)
        self.metrics = ServerMetrics(engine, lambda: self.admission.num_in_flight)
        self.admission.on_change = self.metrics.in_flight_changed
        self.engine_alive = True  # false once a request found the engine stopped

    @property
    def healthy(self) -> bool:
        return self.engine_alive and self.engine.alive

    # ------------------------------------------------------------------------------------ request flow

    async def create(self, request: Request, task: Task) -> Response:
        """``POST /v1/audio/transcriptions`` (task ``transcribe``) and ``/v1/audio/translations``."""
        ticket = self.admission.acquire()
        response: Response | None = None
        try:
            # The timeout covers reading the upload too: a client trickling its body must not hold a place.
            job = await asyncio.wait_for(self._read(request, task, ticket), self.settings.request_timeout_s)
            client_gone = functools.partial(wait_for_disconnect, request)
            if job.stream:
                response = await self._stream(job, client_gone)
            else:
                response = self._render(job, await self._until_done_or_gone(self._collect(job), client_gone))
            return response
        except ClientGone:
            return Response(status_code=499)  # nobody is listening; the status is for the metrics
        except APIError:
            raise
        except Exception as exc:
            raise self._api_error(exc) from None
        finally:
            if not isinstance(response, SSEResponse):  # a stream releases its ticket when it closes
                ticket.release()

    async def _read(self, request: Request, task: Task, ticket: Ticket) -> TranscriptionJob:
        deadline = asyncio.get_running_loop().time() + self.settings.request_timeout_s
        form = await read_form(request, self.settings.max_upload_bytes)
        try:
            return await self._prepare(task, form, ticket, deadline)
        finally:
            await form.close()

    async def _prepare(self, task: Task, form: FormData, ticket: Ticket, deadline: float) -> TranscriptionJob:
        upload, fields = split_form(form)
        params_type = TranscriptionParams if task == "transcribe" else TranslationParams
        try:
            params = params_type.model_validate(fields)
        except ValidationError as exc:
            raise validation_error(exc) from None
        if not self.settings.accepts_model(params.model):
            raise APIError(404, f"The model `{params.model[:_MAX_NAME_CHARS]}` does not exist; this server "
                           f"serves `{self.settings.served_model_name}`.", param="model", code="model_not_found")
        options = await self._decode_options(task, params)
        source, audio = await self._decode_audio(upload)
        duration_s = audio_duration(audio)
        if duration_s > self.settings.max_audio_seconds:
            raise APIError(400, f"{source}: the audio is {duration_s:.1f} s long; this server accepts at most "
                           f"{self.settings.max_audio_seconds:g} s.", param="file", code="audio_too_long")
        return TranscriptionJob(task, params, source, audio, duration_s, options, ticket, deadline)

    async def _decode_options(self, task: Task, params: TranslationParams) -> DecodeOptions:
        """Refuses, saying why, every option this server would otherwise have to ignore."""
        if params.prompt:
            raise APIError(400, "'prompt' is not supported yet: the decoder does not take a text prompt.",
                           param="prompt", code="unsupported_parameter")
        if params.temperature > 0:
            raise APIError(400, "Only temperature 0 (greedy decoding) is served; sampling is not implemented yet.",
                           param="temperature", code="unsupported_parameter")
        language, timestamps = None, False
        if isinstance(params, TranscriptionParams):
            if "word" in params.timestamp_granularities:
                raise APIError(400, "Word timestamps are not available yet; only 'segment' granularity is.",
                               param="timestamp_granularities", code="unsupported_parameter")
            if params.timestamp_granularities and params.response_format != "verbose_json":
                raise APIError(400, "'timestamp_granularities' needs response_format 'verbose_json'.",
                               param="timestamp_granularities")
            if params.stream and params.response_format not in _STREAMED_FORMATS:
                raise APIError(400, f"stream=true sends text events; response_format must be json or text, not "
                               f"{params.response_format}.", param="stream")
            language = params.language or None
            # Segment granularity: segments from timestamp tokens (otherwise one segment per 30 s window).
            timestamps = "segment" in params.timestamp_granularities
        options = DecodeOptions(language=language, task=task, timestamps=timestamps)
        try:
            await self.engine.check(options)
        except UnsupportedOptionError as exc:
            raise APIError(400, str(exc), param="language" if language else None,
                           code="unsupported_option") from None
        return options

    async def _decode_audio(self, upload: UploadFile) -> tuple[str, np.ndarray]:
        source = os.path.basename(upload.filename or "")[:_MAX_NAME_CHARS] or "file"
        data = await upload.read()
        try:  # libsndfile, FFmpeg and soxr release the GIL: decoding on a worker keeps the loop answering
            return source, await asyncio.to_thread(to_samples, data, source)
        except AudioDecodeError as exc:
            raise APIError(400, f"Could not read the audio: {exc}", param="file", code="invalid_audio") from None

    # ------------------------------------------------------------------------------------ decoding

    async def _collect(self, job: TranscriptionJob) -> TranscriptionResult:
        decode = WindowedDecode(self.engine, job.audio, job.options, partial=False)
        finals: dict[int, RequestOutput] = {}
        try:
            while not decode.done:
                index, output = await decode.next(job.deadline)
                finals[index] = output
                self._observe_window(output)
        finally:
            decode.cancel()
        # Only finished outputs came; the engine stamped each window's first token (perf_counter is one
        # system-wide monotonic clock, so an engine process's stamps compare with ours).
        first_tokens = [o.timings.first_token for o in finals.values() if o.timings.first_token is not None]
        if first_tokens:
            self.metrics.first_token_seconds.observe(max(min(first_tokens) - job.ticket.admitted_at, 0.0))
        return self._result(job, finals)

    async def _stream(self, job: TranscriptionJob, client_gone: Callable[[], Awaitable[None]]) -> SSEResponse:
        """Waits for the first output before answering, so that a request the engine refuses gets its real
        status (429, 504) rather than a 200 stream carrying an error."""
        decode = WindowedDecode(self.engine, job.audio, job.options, partial=True)
        try:
            first = await self._until_done_or_gone(decode.next(job.deadline), client_gone)
        except BaseException:
            decode.cancel()
            raise

        def close() -> None:
            decode.cancel()
            job.ticket.release()

        return SSEResponse(self._events(job, decode, first), on_close=close)

    async def _events(self, job: TranscriptionJob, decode: WindowedDecode, first: tuple[int, RequestOutput]):
        text = OrderedText(self.tokenizer, decode.num_windows)
        finals: dict[int, RequestOutput] = {}
        index, output = first
        self.metrics.first_token_seconds.observe(time.perf_counter() - job.ticket.admitted_at)
        try:
            while True:
                if output.finished:
                    finals[index] = output
                    self._observe_window(output)
                piece = text.add(index, output)
                if piece:
                    yield sse_data(TextDeltaEvent(delta=piece))
                if decode.done:
                    break
                index, output = await decode.next(job.deadline)
            yield sse_data(TextDoneEvent(text=self._result(job, finals).transcription.text))
        except Exception as exc:  # the status line is gone: OpenAI's clients raise on an ``error`` event
            yield sse_data(self._api_error(exc).body())
        finally:
            decode.cancel()

    @staticmethod
    async def _until_done_or_gone(work: Coroutine[Any, Any, T], client_gone: Callable[[], Awaitable[None]]) -> T:
        """Runs ``work`` unless the client disconnects first; then cancels it (aborting its engine requests)
        and raises ``ClientGone``. A handler that is not streaming is not cancelled by the server on
        disconnect, so without this an abandoned request would decode to the end."""
        work_task = asyncio.ensure_future(work)
        gone_task = asyncio.ensure_future(client_gone())
        try:
            await asyncio.wait({work_task, gone_task}, return_when=asyncio.FIRST_COMPLETED)
            if work_task.done():
                return work_task.result()
            raise ClientGone()
        finally:
            work_task.cancel()
            gone_task.cancel()

    def _result(self, job: TranscriptionJob, finals: dict[int, RequestOutput]) -> TranscriptionResult:
        window = self.engine.window_samples
        windows = [decoded_window(self.tokenizer, i, window, job.duration_s, finals[i].token_ids, finals[i].language,
                                  avg_logprob=finals[i].avg_logprob, no_speech_prob=finals[i].no_speech_prob)
                   for i in sorted(finals)]
        self.metrics.total_seconds.observe(time.perf_counter() - job.ticket.admitted_at)
        self.metrics.audio_seconds.inc(job.duration_s)
        return TranscriptionResult(assemble(job.source, job.duration_s, windows), windows)

    def _observe_window(self, output: RequestOutput) -> None:
        timings = output.timings
        if timings.encode_start is not None:
            self.metrics.queue_seconds.observe(max(timings.encode_start - timings.queued, 0.0))

    # ------------------------------------------------------------------------------------ answers

    def _render(self, job: TranscriptionJob, result: TranscriptionResult) -> Response:
        fmt = job.params.response_format
        transcription = result.transcription
        usage = Usage(seconds=transcription.duration_s) if job.task == "transcribe" else None
        if fmt in _TEXT_FORMATS:
            return PlainTextResponse(render(transcription, _TEXT_FORMATS[fmt]))
        if fmt == "verbose_json":
            body = VerboseTranscriptionResponse(
                task=job.task,
                # A translation's language is its output's (OpenAI: always English); a transcription's, the audio's.
                language="en" if job.task == "translate" else transcription.language or job.options.language or "",
                duration=transcription.duration_s,
                text=transcription.text,
                segments=[_timestamped_segment(i, w, seg, self.tokenizer.decode(list(seg.token_ids)))
                          for i, (w, seg) in enumerate((w, seg) for w in result.windows for seg in w.segments)]
                if job.options.timestamps
                else [_verbose_segment(i, w) for i, w in enumerate(w for w in result.windows if w.text.strip())],
                usage=usage,
            )
            return JSONResponse(body.model_dump(exclude={"usage"} if usage is None else None))
        return JSONResponse(TranscriptionResponse(text=transcription.text, usage=usage).model_dump(exclude_none=True))

    def _api_error(self, exc: Exception) -> APIError:
        if isinstance(exc, APIError):
            return exc
        if isinstance(exc, EngineOverloadedError):
            return busy("The engine's queue is full; retry shortly.", self.settings.retry_after_s)
        if isinstance(exc, TimeoutError):
            return APIError(504, f"The request did not finish within {self.settings.request_timeout_s:g} s and "
                            "was aborted.", type="timeout_error", code="request_timeout")
        if isinstance(exc, UnsupportedOptionError):  # the engine refused what ``check`` let through
            return APIError(400, str(exc), code="unsupported_option")
        if isinstance(exc, EngineDeadError):
            self.engine_alive = False
            log.error("engine unavailable: %s", exc)
            return APIError(503, "The engine has stopped; this server cannot transcribe.", type="server_error",
                            code="engine_unavailable")
        log.error("transcription failed", exc_info=exc)
        return internal_error()


def _verbose_segment(segment_id: int, window: DecodedWindow) -> VerboseSegment:
    text_bytes = window.text.encode("utf-8")
    return VerboseSegment(
        id=segment_id,
        seek=window.start_sample // SAMPLES_PER_FRAME,
        start=window.start_s,
        end=window.end_s,
        text=window.text,
        tokens=window.token_ids,
        temperature=0.0,  # greedy decoding, no temperature fallback
        avg_logprob=None,
        compression_ratio=len(text_bytes) / len(zlib.compress(text_bytes)),  # as Whisper computes it
        no_speech_prob=None,
    )


def _timestamped_segment(segment_id: int, window: DecodedWindow, segment: Segment, text: str) -> VerboseSegment:
    """A segment closed by timestamp tokens, with the decoding details of its window; ``text`` as decoded
    (leading space kept, as Whisper's segments do)."""
    return VerboseSegment(
        id=segment_id,
        seek=window.start_sample // SAMPLES_PER_FRAME,
        start=segment.start,
        end=segment.end,
        text=text,
        tokens=list(segment.token_ids),
        temperature=segment.temperature,
        avg_logprob=segment.avg_logprob,
        compression_ratio=segment.compression_ratio,
        no_speech_prob=segment.no_speech_prob,
    )
