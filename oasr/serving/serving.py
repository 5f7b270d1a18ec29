"""The OpenAI audio endpoints' logic against an engine client: upload -> 30 s windows -> one engine request per
window, all at once -> one result, rendered in the asked format or streamed as text events.

Every way a request can end (answered, failed, timed out, client gone, stream closed) cancels its windows'
output iterators, which aborts their engine requests and frees their rows; admission is released with it.

The request fields mean what OpenAI's do, decoded as ``oasr.transcribe`` decodes (parallel long-form mode), so
the server answers the same text as offline on the same options:
- ``prompt``: every window is conditioned on the text (openai-whisper's ``initial_prompt``: after
  ``<|startofprev|>``, its newest tokens up to half the decoder's positions).
- ``temperature`` above 0: every window samples at that temperature. 0 decodes greedily with OpenAI's automatic
  raise of the temperature (openai-whisper's fallback) on audio longer than one window or with segments, as
  ``oasr.transcribe`` does: windows are decoded as ``oasr.transcription.parallel`` plans them, continued where
  a decode stopped short, decoded again where it failed the checks, silent where ``<|nospeech|>`` wins.
  Streamed text therefore arrives as each decode is kept, except for audio of one window without segments,
  decoded once as asked, whose tokens stream as they come.
- ``timestamp_granularities`` ``word`` (verbose_json): once every window is decoded, the engine aligns their
  tokens to the audio (``oasr.transcription.words``: one more encoder pass, the alignment heads' cross-attention, DTW)
  and the answer carries ``words``; ``segment`` gives segments from timestamp tokens.
A model that cannot serve a field (a CTC or transducer model takes no prompt, does not sample, has no word
timestamps) refuses it with a 400 naming the field.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import numpy as np
from pydantic import ValidationError
from starlette.datastructures import FormData, UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from oasr.audio import audio_duration
from oasr.hosting.relay import EngineDeadError, EngineOverloadedError, ReplicaLostError
from oasr.transcription.spans import Span, SpanPlanner, long_audio_detector, to_samples
from oasr.engine.request import INTERACTIVE_PRIORITY, RequestOutput
from oasr.transcription.parallel import CoverPlan, cover_plan
from oasr.transcription.results import DecodedWindow, assemble, timestamp_begin_of, with_words
from oasr.transcription.punctuation import punctuator_for
from oasr.transcription.words import alignment_rows
from oasr.errors import AudioDecodeError, AudioTooLongError, UnsupportedOptionError
from oasr.serving.admission import Admission, ClientCaps, Ticket, busy
from oasr.serving.decoding import OrderedText, WindowedDecode, WindowProgress
from oasr.serving.diarization import DiarizationService, check_diarized, diarize_within
from oasr.serving.diarization_formats import diarized_response, diarized_segments, with_speakers
from oasr.hosting.engine_client import EngineClient
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
    VerboseTranscriptionResponse,
    internal_error,
    validation_error,
)
from oasr.serving.server_decoding import ServerSearchConflict
from oasr.serving.settings import ServerSettings
from oasr.serving.sse import SSEResponse, sse_data
from oasr.serving.upload import ClientGone, read_form, split_form, wait_for_disconnect
from oasr.serving.verbose import verbose_language, verbose_segments, verbose_words
from oasr.diarization.assign import speaker_turns
from oasr.diarization.types import SpeakerSegment
from oasr.types import (DecodeOptions, FallbackOptions, Hotword, HotwordsError, Task, Transcription,
                        parse_hotwords)

log = logging.getLogger(__name__)
T = TypeVar("T")

_MAX_NAME_CHARS = 128  # of a client's file or model name echoed back in errors
_TEXT_FORMATS = {"text": "txt", "srt": "srt", "vtt": "vtt"}
# decoded with timestamps unless granularities say otherwise
_TIMED_FORMATS = ("srt", "vtt", "verbose_json", "diarized_json")
# A stream carries text events (diarized_json's speaker segments once they are known); subtitles and verbose
# segments need the end.
_STREAMED_FORMATS = ("json", "text", "diarized_json")
# With a diarization model, these carry speakers; the speaker turns of all but verbose_json (whose segments are
# the decoder's) split where a word's speaker changes, so their words are timed where the model can.
_SPEAKER_FORMATS = ("srt", "vtt", "verbose_json", "diarized_json")
_TURN_FORMATS = ("srt", "vtt", "diarized_json")


@dataclass(frozen=True)
class TranscriptionJob:
    task: Task
    params: TranslationParams  # a ``TranscriptionParams`` for the transcriptions route
    source: str  # the upload's file name, as the client gave it (safe to echo)
    audio: np.ndarray
    duration_s: float
    options: DecodeOptions
    spans: list[Span]  # where the audio is cut into windows, as offline cuts it
    plan: CoverPlan  # how its windows are decoded, as offline decodes them
    ticket: Ticket
    deadline: float  # event-loop time (from admission) after which the request is aborted (504)
    speakers: bool = False  # the diarization model runs on the audio: the answer carries speakers
    turn_words: bool = False  # words are timed (not shown) so that speaker turns split between them

    @property
    def stream(self) -> bool:
        return isinstance(self.params, TranscriptionParams) and self.params.stream

    @property
    def granularities(self) -> list[str]:
        return self.params.timestamp_granularities if isinstance(self.params, TranscriptionParams) else []

    @property
    def word_timestamps(self) -> bool:
        return "word" in self.granularities

    @property
    def aligns_words(self) -> bool:
        return self.word_timestamps or self.turn_words


@dataclass(frozen=True)
class TranscriptionResult:
    transcription: Transcription
    windows: list[DecodedWindow]
    activity: tuple[SpeakerSegment, ...] | None = None  # who spoke when (None: no speakers asked for)


class OpenAIServingTranscription:
    def __init__(self, engine: EngineClient, settings: ServerSettings) -> None:
        self.engine = engine
        self.settings = settings
        self.tokenizer = engine.tokenizer
        self.admission = Admission(settings.max_in_flight, settings.retry_after_s)
        self.client_caps = ClientCaps(settings.max_in_flight_per_client, settings.max_in_flight_per_key,
                                      settings.retry_after_s)
        self.metrics = ServerMetrics(engine, lambda: self.admission.num_in_flight)
        # --diarization-model's engine object, beside the core (None: no speakers on this server)
        self.diarization = (DiarizationService(settings.diarization_model, settings.diarization_device, engine)
                            if settings.diarization_model else None)
        # A request found the engine stopped (None: none has): the engine's restart count then. Unhealthy until a
        # restarted engine core serves, even where the client has not noticed the death itself.
        self._died_at_restart: int | None = None
        self.admission.on_change = self.metrics.in_flight_changed
        # Offline's cut: fixed windows, or quiet points for decoders without timestamps (the energy detector runs
        # on numpy-sized work here, beside the upload decoding).
        self.span_planner = SpanPlanner(long_audio_detector(engine.capabilities, None), engine.window_samples)
        self.punctuator = punctuator_for(settings.punctuate, engine.capabilities, settings.served_model_name)

    @property
    def healthy(self) -> bool:
        restarts = getattr(self.engine, "num_restarts", 0)
        return self.engine.alive and (self._died_at_restart is None or restarts > self._died_at_restart)

    # ------------------------------------------------------------------------------------ request flow

    async def create(self, request: Request, task: Task, api_key: int | None = None) -> Response:
        """``POST /v1/audio/transcriptions`` (task ``transcribe``) and ``/v1/audio/translations``; ``api_key``:
        the index of the key the request authenticated with."""
        # Before the body is read, so that one client's uploads in progress are capped too.
        hold = self.client_caps.acquire(request.client.host if request.client else "", api_key)
        job: TranscriptionJob | None = None
        response: Response | None = None
        try:
            job = await self._read(request, task, hold)
            client_gone = functools.partial(wait_for_disconnect, request)
            if job.stream:
                response = await self._stream(job, client_gone)
            else:
                response = self._render(job, await self._until_done_or_gone(self._collect(job), client_gone))
            return response
        except ClientGone:
            return Response(status_code=499)  # nobody is listening; the status is for the metrics
        except asyncio.CancelledError:
            # Only a server shutting down cancels a request's task (its graceful period ran out: uvicorn would
            # answer 500). Its engine work is aborted on the way out; the client is told to retry.
            raise APIError(503, "The server is shutting down; retry the request.", type="server_error",
                           code="shutting_down", headers={"Retry-After": str(self.settings.retry_after_s)}) from None
        except APIError:
            raise
        except Exception as exc:
            raise self._api_error(exc) from None
        finally:
            if not isinstance(response, SSEResponse):  # a stream releases its ticket (and hold) when it closes
                if job is not None:
                    job.ticket.release()
                hold.release()

    async def _read(self, request: Request, task: Task, hold: Ticket) -> TranscriptionJob:
        """The whole upload (within the body timeout), then a queue place: a client still sending its body
        holds none. The request timeout runs from admission; the job's ticket releases ``hold`` too."""
        form = await read_form(request, self.settings.max_upload_bytes, self.settings.body_timeout_s)
        try:
            ticket = self.admission.acquire(hold)
            deadline = asyncio.get_running_loop().time() + self.settings.request_timeout_s
            try:
                return await asyncio.wait_for(self._prepare(task, form, ticket, deadline),
                                              self.settings.request_timeout_s)
            except BaseException:
                ticket.release()
                raise
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
        spans = self.span_planner(audio)
        speakers = self.diarization is not None and params.response_format in _SPEAKER_FORMATS
        turn_words = (speakers and params.response_format in _TURN_FORMATS and self.engine.supports_word_timestamps)
        return TranscriptionJob(task, params, source, audio, duration_s, options, spans,
                                await self._plan(options, len(spans)), ticket, deadline, speakers, turn_words)

    async def _plan(self, options: DecodeOptions, num_windows: int) -> CoverPlan:
        """``oasr.transcribe``'s plan for these options: fallback temperatures unless one was asked for."""
        serves_timestamps = (num_windows > 1 and timestamp_begin_of(self.tokenizer) is not None
                             and await self._serves(replace(options, timestamps=True)))
        fallback = FallbackOptions(temperatures=(options.temperature,)) if options.temperature else FallbackOptions()
        return cover_plan(self.tokenizer, options, fallback, num_windows=num_windows,
                          serves_timestamps=serves_timestamps)

    async def _decode_options(self, task: Task, params: TranslationParams) -> DecodeOptions:
        """Refuses, saying why, every option this server would otherwise have to ignore. Temperature 0 is greedy
        decoding with openai-whisper's fallback (see the module's docstring)."""
        language, granularities = params.language or None, []
        if params.response_format == "diarized_json":
            check_diarized(task, self.diarization)
        if isinstance(params, TranscriptionParams):
            if params.timestamp_granularities and params.response_format != "verbose_json":
                raise APIError(400, "'timestamp_granularities' needs response_format 'verbose_json'.",
                               param="timestamp_granularities")
            if params.stream and params.response_format not in _STREAMED_FORMATS:
                raise APIError(400, f"stream=true sends text events; response_format must be json or text, not "
                               f"{params.response_format}.", param="stream")
            if "word" in params.timestamp_granularities and not self.engine.supports_word_timestamps:
                raise APIError(400, f"The model `{self.settings.served_model_name}` gives no word timestamps "
                               "(Whisper models do); ask for 'segment' granularity or none.",
                               param="timestamp_granularities", code="unsupported_option")
            granularities = params.timestamp_granularities
        # Segment granularity: segments from timestamp tokens (otherwise one segment per 30 s window). Subtitles
        # and verbose_json without granularities imply it (as the CLI's srt and vtt do) if the model has them.
        timestamps = "segment" in granularities
        if not granularities and params.response_format in _TIMED_FORMATS:
            timestamps = await self._serves(DecodeOptions(task=task, timestamps=True))
        try:
            target = params.target_language if isinstance(params, TranscriptionParams) else None
            options = DecodeOptions(language=language, target_language=target, task=task, timestamps=timestamps,
                                    temperature=params.temperature, prompt=params.prompt or None,
                                    beam_size=params.beam_size, patience=params.patience,
                                    length_penalty=params.length_penalty, hotwords=inline_hotwords(params.hotwords),
                                    rescore_weight=params.rescore_weight)
        except ValueError as exc:  # options that contradict each other (a beam with sampling, patience alone)
            param = next((name for name in ("hotwords", "rescore_weight", "beam_size", "patience", "length_penalty")
                          if getattr(params, name) is not None), None)
            raise APIError(400, f"{exc}.", param=param, code="invalid_value") from None
        try:
            await self.engine.check(options)
        except ServerSearchConflict as exc:  # the request against the server's own search (oasr serve --lm)
            raise APIError(400, f"{exc}.", param=exc.param, code="unsupported_option") from None
        except UnsupportedOptionError as exc:
            raise await self._refusal(options, exc) from None
        return options

    async def _refusal(self, options: DecodeOptions, exc: UnsupportedOptionError) -> APIError:
        """The 400 for options the engine refused, naming the request field it refuses on its own (asked one
        field at a time; only a refused request pays for these checks)."""
        capabilities = self.engine.capabilities
        if (options.hotwords and options.beam_size is None and capabilities is not None
                and "hotwords" in capabilities.served_options and capabilities.hotwords_need_beam):
            return APIError(400, f"{exc}.", param="hotwords", code="invalid_value")  # "give beam_size too"
        plain = DecodeOptions(task=options.task)
        if options.language is not None and not await self._serves(plain):
            # A model that needs the spoken language (Canary does not detect it): check the others beside it.
            with_language = replace(plain, language=options.language)
            plain = with_language if await self._serves(with_language) else plain
        fields = {"language": replace(plain, language=options.language),
                  "target_language": replace(plain, target_language=options.target_language),
                  "prompt": replace(plain, prompt=options.prompt),
                  "temperature": replace(plain, temperature=options.temperature),
                  "timestamp_granularities": replace(plain, timestamps=options.timestamps),
                  "beam_size": replace(plain, beam_size=options.beam_size, patience=options.patience,
                                       length_penalty=options.length_penalty),
                  "hotwords": replace(plain, beam_size=options.beam_size, hotwords=options.hotwords),
                  "rescore_weight": replace(plain, beam_size=options.beam_size, rescore_weight=options.rescore_weight)}
        refused = None
        if await self._serves(plain):  # else the task itself is refused (an English-only model translating)
            for field, alone in fields.items():
                if alone != plain and not await self._serves(alone):
                    refused = field
                    break
        model = f"The model `{self.settings.served_model_name}`"
        message = {
            "prompt": f"{model} takes no text prompt; send the request without 'prompt'.",
            "temperature": f"{model} decodes greedily only; 'temperature' must be 0.",
            "timestamp_granularities": f"{model} gives no segment timestamps; leave out 'timestamp_granularities'.",
            "beam_size": (f"{exc}." if capabilities is not None and "beam_size" in capabilities.served_options
                          else f"{model} has no beam search; send the request without 'beam_size'."),
            "hotwords": f"{model} takes no hotwords; send the request without 'hotwords'.",
            "rescore_weight": f"{model} has no attention decoder to rescore with; send the request without "
                              "'rescore_weight'.",
            "target_language": f"{model} cannot write target_language {options.target_language!r}.",
        }.get(refused, str(exc))
        return APIError(400, message, param=refused, code="unsupported_option")

    async def _serves(self, options: DecodeOptions) -> bool:
        try:
            await self.engine.check(options)
        except UnsupportedOptionError:
            return False
        return True

    async def _decode_audio(self, upload: UploadFile) -> tuple[str, np.ndarray]:
        source = os.path.basename(upload.filename or "")[:_MAX_NAME_CHARS] or "file"
        data = await upload.read()
        limit = self.settings.max_audio_seconds
        try:  # libsndfile, FFmpeg and soxr release the GIL: decoding on a worker keeps the loop answering
            # The limit goes into decoding: a header that lies about its rate or length must not cost memory.
            return source, await asyncio.to_thread(to_samples, data, source, limit)
        except AudioTooLongError as exc:
            raise APIError(400, f"{source}: {exc.length}; this server accepts at most {limit:g} s.", param="file",
                           code="audio_too_long") from None
        except AudioDecodeError as exc:
            raise APIError(400, f"Could not read the audio: {exc}", param="file", code="invalid_audio") from None

    # ------------------------------------------------------------------------------------ realtime turns

    async def transcribe_turn(self, audio: np.ndarray, options: DecodeOptions, hold: Ticket,
                              on_text: Callable[[str], Awaitable[None]], *, words: bool = False) -> Transcription:
        """One realtime turn (16 kHz samples) decoded as an upload's audio is, beside the uploads: a place in
        admission (releasing ``hold``, the turn's place among its client's, with it), the offline cut and plan,
        every window at once; text handed to ``on_text`` as it becomes stable; with ``words`` (a model that
        times them), its segments' words aligned once the text is done. Raises ``APIError`` (busy, timed out,
        the engine stopped). Cancelling it aborts the turn's engine requests. Its windows go in at
        ``INTERACTIVE_PRIORITY``: someone is waiting on the turn, so the scheduler takes it ahead of uploads."""
        try:
            ticket = self.admission.acquire(hold)
        except APIError:
            hold.release()
            raise
        deadline = asyncio.get_running_loop().time() + self.settings.request_timeout_s
        decode: WindowedDecode | None = None
        try:
            spans = self.span_planner(audio)
            decode = WindowedDecode(self.engine, audio, spans, await self._plan(options, len(spans)), partial=True,
                                    priority=INTERACTIVE_PRIORITY)
            text = OrderedText(self.tokenizer, decode.num_windows)
            while not decode.done:
                index, progress = await decode.next(deadline)
                if progress.output is not None:
                    self._observe_window(progress.output)
                piece = text.add(index, progress)
                if piece:
                    await on_text(piece)
            windows = decode.results()
            if words and self.engine.supports_word_timestamps:
                windows = await self._aligned(windows, decode.windows, options.task, deadline)
            windows = await self._punctuated(windows)
            duration_s = audio_duration(audio)
            self.metrics.total_seconds.observe(time.perf_counter() - ticket.admitted_at)
            self.metrics.audio_seconds.inc(duration_s)
            return assemble("realtime", duration_s, windows)
        except (APIError, asyncio.CancelledError):
            raise
        except Exception as exc:
            raise self._api_error(exc) from None
        finally:
            if decode is not None:
                decode.cancel()
            ticket.release()

    async def transcribe_samples(self, audio: np.ndarray, options: DecodeOptions, hold: Ticket, *,
                                 word_timestamps: bool = False, source: str = "audio") -> TranscriptionResult:
        """Decoded 16 kHz audio answered as an upload's is (a front end other than HTTP: gRPC's Recognize): a
        place in admission (releasing ``hold`` with it), the offline cut and plan, words aligned when asked, the
        request timeout. Raises ``APIError``; cancelling it aborts the engine requests."""
        try:
            ticket = self.admission.acquire(hold)
        except APIError:
            hold.release()
            raise
        try:
            deadline = asyncio.get_running_loop().time() + self.settings.request_timeout_s
            spans = self.span_planner(audio)
            params = TranscriptionParams(model=self.settings.served_model_name,
                                         response_format="verbose_json" if word_timestamps else "json",
                                         timestamp_granularities=["word"] if word_timestamps else [])
            job = TranscriptionJob(options.task, params, source, audio, audio_duration(audio), options, spans,
                                   await self._plan(options, len(spans)), ticket, deadline)
            return await asyncio.wait_for(self._collect(job), self.settings.request_timeout_s)
        except (APIError, asyncio.CancelledError):
            raise
        except Exception as exc:
            raise self._api_error(exc) from None
        finally:
            ticket.release()

    # ------------------------------------------------------------------------------------ decoding

    def _start_speakers(self, job: TranscriptionJob) -> asyncio.Task | None:
        """The diarization of the job's audio, running beside its decode (None when it needs none)."""
        if not job.speakers or self.diarization is None:
            return None
        return asyncio.ensure_future(diarize_within(self.diarization, job.audio, job.source, job.deadline))

    async def _collect(self, job: TranscriptionJob) -> TranscriptionResult:
        speakers = self._start_speakers(job)
        try:
            result = await self._collect_text(job)
            return replace(result, activity=await speakers) if speakers is not None else result
        finally:
            if speakers is not None:
                speakers.cancel()

    async def _collect_text(self, job: TranscriptionJob) -> TranscriptionResult:
        decode = WindowedDecode(self.engine, job.audio, job.spans, job.plan, partial=False)
        finals: list[RequestOutput] = []
        try:
            while not decode.done:
                _, progress = await decode.next(job.deadline)
                if progress.output is not None:
                    finals.append(progress.output)
                    self._observe_window(progress.output)
        finally:
            decode.cancel()
        # Only finished outputs came; the engine stamped each decode's first token (perf_counter is one
        # system-wide monotonic clock, so an engine process's stamps compare with ours).
        first_tokens = [o.timings.first_token for o in finals if o.timings.first_token is not None]
        if first_tokens:
            self.metrics.first_token_seconds.observe(max(min(first_tokens) - job.ticket.admitted_at, 0.0))
        windows = decode.results()
        if job.aligns_words:
            windows = await self._with_words(job, windows, decode.windows)
        return self._result(job, await self._punctuated(windows))

    async def _with_words(self, job: TranscriptionJob, windows: list[DecodedWindow],
                          audio: list[np.ndarray]) -> list[DecodedWindow]:
        """The windows with their words, aligned by the engine within the request's deadline."""
        return await self._aligned(windows, audio, job.task, job.deadline)

    async def _punctuated(self, windows: list[DecodedWindow]) -> list[DecodedWindow]:
        """The windows with --punctuate's punctuation carried onto their texts and words (unchanged without it);
        the model runs on a worker thread, beside the event loop."""
        if self.punctuator is None:
            return windows
        return await asyncio.to_thread(self.punctuator.windows, windows)

    async def punctuated_text(self, text: str) -> str:
        """A realtime turn's completed transcript with --punctuate's punctuation (unchanged without it)."""
        if self.punctuator is None:
            return text
        return await asyncio.to_thread(self.punctuator.text, text)

    async def _aligned(self, windows: list[DecodedWindow], audio: list[np.ndarray], task: Task,
                       deadline: float) -> list[DecodedWindow]:
        rows = alignment_rows(windows, audio, task, self.engine.window_samples)
        timeout = deadline - asyncio.get_running_loop().time()
        if timeout <= 0:
            raise TimeoutError
        words = await asyncio.wait_for(self.engine.align_words(rows, audio), timeout)
        return [with_words(w, tuple(ws)) for w, ws in zip(windows, words, strict=True)]

    async def _stream(self, job: TranscriptionJob, client_gone: Callable[[], Awaitable[None]]) -> SSEResponse:
        """Waits for the first output before answering, so that a request the engine refuses gets its real
        status (429, 504) rather than a 200 stream carrying an error."""
        decode = WindowedDecode(self.engine, job.audio, job.spans, job.plan, partial=True)
        speakers = self._start_speakers(job)
        try:
            first = await self._until_done_or_gone(decode.next(job.deadline), client_gone)
        except BaseException:
            decode.cancel()
            if speakers is not None:
                speakers.cancel()
            raise

        def close() -> None:
            decode.cancel()
            if speakers is not None:
                speakers.cancel()
            job.ticket.release()

        return SSEResponse(self._events(job, decode, first, speakers), on_close=close)

    async def _events(self, job: TranscriptionJob, decode: WindowedDecode, first: tuple[int, WindowProgress],
                      speakers: asyncio.Task | None = None):
        """Text deltas as the windows decode; with speakers (diarized_json), each speaker segment's
        ``transcript.text.segment`` once every window is decoded (its words timed, where the turns split on
        them) and the diarization is done; then ``transcript.text.done``."""
        text = OrderedText(self.tokenizer, decode.num_windows)
        index, progress = first
        self.metrics.first_token_seconds.observe(time.perf_counter() - job.ticket.admitted_at)
        try:
            while True:
                if progress.output is not None:
                    self._observe_window(progress.output)
                piece = text.add(index, progress)
                if piece:
                    yield sse_data(TextDeltaEvent(delta=piece))
                if decode.done:
                    break
                index, progress = await decode.next(job.deadline)
            windows = decode.results()
            if job.aligns_words:
                windows = await self._with_words(job, windows, decode.windows)
            result = self._result(job, await self._punctuated(windows))
            if speakers is not None:
                for segment in diarized_segments(speaker_turns(result.transcription.segments, await speakers)):
                    yield sse_data(segment)
            yield sse_data(TextDoneEvent(text=result.transcription.text))
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

    def _result(self, job: TranscriptionJob, windows: list[DecodedWindow]) -> TranscriptionResult:
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
        if result.activity is not None and fmt != "verbose_json":
            return diarized_response(fmt, transcription, result.activity, usage.seconds if usage else None)
        if fmt in _TEXT_FORMATS:
            return PlainTextResponse(render(transcription, _TEXT_FORMATS[fmt]))
        if fmt == "verbose_json":
            only_words = job.word_timestamps and "segment" not in job.granularities
            body = VerboseTranscriptionResponse(
                task=job.task,
                language=verbose_language(job.task, transcription.language, job.options.language),
                duration=transcription.duration_s,
                text=transcription.text,
                segments=None if only_words else verbose_segments(self.tokenizer, result.windows, job.options),
                words=verbose_words(result.windows) if job.word_timestamps else None,
                usage=usage,
                **(self.tokenizer.audio_tags(transcription.token_ids) if self.engine.capabilities.audio_tags else {}),
            )
            content = body.model_dump(exclude={k for k in ("segments", "words", "usage", "emotion", "event")
                                               if getattr(body, k) is None})
            return JSONResponse(content if result.activity is None else with_speakers(content, result.activity))
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
        if isinstance(exc, ReplicaLostError):  # one replica of several: the server stays up, a retry may be served
            log.error("request failed: %s", exc)
            return APIError(503, "The engine replica serving this request stopped; retry the request.",
                            type="server_error", code="replica_unavailable",
                            headers={"Retry-After": str(self.settings.retry_after_s)})
        if isinstance(exc, EngineDeadError):
            self._died_at_restart = getattr(self.engine, "num_restarts", 0)
            log.error("engine unavailable: %s", exc)
            if getattr(self.engine, "state", "dead") == "starting":
                return APIError(503, "The engine has stopped; a new engine core is loading the model, retry "
                                "shortly.", type="server_error", code="engine_unavailable",
                                headers={"Retry-After": str(self.settings.retry_after_s)})
            return APIError(503, "The engine has stopped; this server cannot transcribe.", type="server_error",
                            code="engine_unavailable")
        log.error("transcription failed", exc_info=exc)
        return internal_error()


def inline_hotwords(spec: str | None) -> tuple[Hotword, ...]:
    """The form's hotword list, inline only (a ValueError, turned into a 400, for "@FILE" or a bad entry)."""
    if spec is None or not spec.strip():
        return ()
    if spec.lstrip().startswith("@"):
        raise ValueError("hotwords are sent inline ('phrase[:boost],...'); a file on the server cannot be named")
    try:
        return parse_hotwords(spec)
    except HotwordsError as exc:
        raise ValueError(str(exc)) from None
