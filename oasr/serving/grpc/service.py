"""The servicer of ``nvidia.riva.asr.RivaSpeechRecognition``, on the HTTP app's serving objects: the same engine
client, API keys, admission and caps, metrics and lifecycle.

Every call is checked in one order: the server's state (UNAVAILABLE while draining or without an engine), the
API key (metadata ``authorization: Bearer KEY``; UNAUTHENTICATED), the config (INVALID_ARGUMENT naming the
field, as the request spells it), the caps (RESOURCE_EXHAUSTED). A Recognize takes a place among its client's and
key's requests and then in admission, as an upload does; a stream takes a realtime session's place (the caps of
``--realtime-max-sessions*`` cover WebSocket sessions and gRPC streams together), and each of an offline model's
turns a request's place. ``oasr_grpc_requests_total{method,code}`` counts the calls by their status.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

import grpc
from prometheus_client import Counter

from oasr.errors import UnsupportedOptionError
from oasr.serving.auth import api_key_index
from oasr.serving.grpc.audio import decode_recording
from oasr.serving.grpc.config import RecognitionRequest, RivaError, invalid, read_config
from oasr.serving.grpc.protos import riva_asr_pb2, riva_asr_pb2_grpc
from oasr.serving.grpc.results import recognize_response
from oasr.serving.grpc.streaming import LiveModelStream, TurnStream
from oasr.serving.lifecycle import ServerLifecycle, ServerState
from oasr.serving.protocol import APIError
from oasr.serving.realtime.connection import RealtimeService
from oasr.types import DecodeOptions

log = logging.getLogger(__name__)
T = TypeVar("T")

# HTTP statuses of the serving layer's errors, as gRPC codes.
_CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 401: grpc.StatusCode.UNAUTHENTICATED,
          404: grpc.StatusCode.NOT_FOUND, 408: grpc.StatusCode.DEADLINE_EXCEEDED,
          413: grpc.StatusCode.INVALID_ARGUMENT, 429: grpc.StatusCode.RESOURCE_EXHAUSTED,
          503: grpc.StatusCode.UNAVAILABLE, 504: grpc.StatusCode.DEADLINE_EXCEEDED}


def riva_error(exc: APIError) -> RivaError:
    message = f"{exc.param}: {exc.message}" if exc.param else exc.message
    return RivaError(_CODES.get(exc.status, grpc.StatusCode.INTERNAL), message)


def peer_host(peer: str) -> str:
    """The address in grpc's peer string ("ipv4:127.0.0.1:5000", "ipv6:[::1]:5000"), as the caps count clients."""
    kind, _, address = peer.partition(":")
    if kind == "ipv6":
        return address.rpartition("]:")[0].lstrip("[") or address
    if kind == "ipv4":
        return address.rpartition(":")[0]
    return peer


class RivaASRService(riva_asr_pb2_grpc.RivaSpeechRecognitionServicer):
    def __init__(self, realtime: RealtimeService, lifecycle: ServerLifecycle) -> None:
        self.realtime = realtime
        self.serving = realtime.serving
        self.settings = self.serving.settings
        self.lifecycle = lifecycle
        self.requests = Counter("oasr_grpc_requests", "gRPC calls answered, by method and status code",
                                ["method", "code"], registry=self.serving.metrics.registry)

    # ------------------------------------------------------------------ the three methods

    async def Recognize(self, request: riva_asr_pb2.RecognizeRequest,
                        context: grpc.aio.ServicerContext) -> riva_asr_pb2.RecognizeResponse:
        return await self._answered("Recognize", self._recognize(request, context), context)

    async def GetRivaSpeechRecognitionConfig(self, request: riva_asr_pb2.RivaSpeechRecognitionConfigRequest,
                                             context: grpc.aio.ServicerContext):
        return await self._answered("GetRivaSpeechRecognitionConfig", self._config(request, context), context)

    async def StreamingRecognize(self, requests: AsyncIterator[riva_asr_pb2.StreamingRecognizeRequest],
                                 context: grpc.aio.ServicerContext) -> AsyncIterator[riva_asr_pb2.StreamingRecognizeResponse]:
        code = grpc.StatusCode.OK
        try:
            async for response in self._stream(requests, context):
                yield response
        except (asyncio.CancelledError, GeneratorExit):  # the client went or cancelled; the engine work is aborted
            code = grpc.StatusCode.CANCELLED
            raise
        except Exception as exc:
            error = self._status(exc)
            code = error.code
            await context.abort(error.code, error.message)  # raises
        finally:
            self.requests.labels(method="StreamingRecognize", code=code.name).inc()

    # ------------------------------------------------------------------ their logic

    async def _recognize(self, request: riva_asr_pb2.RecognizeRequest,
                         context: grpc.aio.ServicerContext) -> riva_asr_pb2.RecognizeResponse:
        api_key = self._admit(context)
        config = await self._read_config(request.config, "config", streaming=False)
        audio = await asyncio.to_thread(decode_recording, config.audio, request.audio, "audio",
                                        self.settings.max_audio_seconds)
        hold = self.serving.client_caps.acquire(peer_host(context.peer()), api_key)
        result = await self.serving.transcribe_samples(audio, config.options, hold,
                                                       word_timestamps=config.word_time_offsets, source="grpc")
        response = recognize_response(result.transcription, result.windows, words=config.word_time_offsets,
                                      language_code=config.language_code)
        if request.HasField("id"):
            response.id.CopyFrom(request.id)
        return response

    async def _config(self, request: riva_asr_pb2.RivaSpeechRecognitionConfigRequest,
                      context: grpc.aio.ServicerContext) -> riva_asr_pb2.RivaSpeechRecognitionConfigResponse:
        self._admit(context)
        name = self.settings.served_model_name
        response = riva_asr_pb2.RivaSpeechRecognitionConfigResponse()
        if request.model_name and not self.settings.accepts_model(request.model_name):
            return response  # Riva answers an unknown model with no configs
        capabilities = self.serving.engine.capabilities
        parameters = {"type": "online" if capabilities.streaming else "offline",
                      "streaming": str(capabilities.streaming is not None).lower(),
                      "word_time_offsets": str(self.serving.engine.supports_word_timestamps).lower(),
                      "tasks": ",".join(capabilities.tasks),
                      "encodings": "LINEAR_PCM,FLAC,MULAW,ALAW,OGGOPUS"}
        response.model_config.add(model_name=name, parameters=parameters)
        return response

    async def _stream(self, requests: AsyncIterator[riva_asr_pb2.StreamingRecognizeRequest],
                      context: grpc.aio.ServicerContext) -> AsyncIterator[riva_asr_pb2.StreamingRecognizeResponse]:
        api_key = self._admit(context)
        client = peer_host(context.peer())
        try:
            first = await asyncio.wait_for(anext(aiter(requests)), self.realtime.settings.idle_timeout_s)
        except StopAsyncIteration:
            raise invalid("streaming_config", "the stream ended before its config") from None
        if not first.HasField("streaming_config"):
            raise invalid("streaming_config", "the first message carries the config, then audio_content follows")
        config = await self._read_config(first.streaming_config.config, "streaming_config.config", streaming=True)
        place = self.realtime.open_session(client, api_key)
        try:
            interim = first.streaming_config.interim_results
            if self.serving.engine.capabilities.streaming is not None:
                stream = LiveModelStream(self.realtime, config, interim)
            else:
                stream = TurnStream(self.realtime, config, interim, client, api_key)
                await stream.start()
            async for response in stream.responses(requests):
                yield response
        finally:
            place.release()

    # ------------------------------------------------------------------ checks

    def _admit(self, context: grpc.aio.ServicerContext) -> int | None:
        """The API key's index (None on an open server), once the server is known to serve."""
        state = self.lifecycle.state
        if state is not ServerState.OK:
            message = {ServerState.DRAINING: "the server is shutting down; retry on another",
                       ServerState.STARTING: "the engine is starting; retry shortly"}.get(
                state, "the engine has stopped; this server cannot transcribe")
            raise RivaError(grpc.StatusCode.UNAVAILABLE, message)
        authorization = next((value for key, value in context.invocation_metadata() or ()
                              if key.lower() == "authorization"), "")
        if isinstance(authorization, bytes):
            authorization = authorization.decode("latin-1")
        try:
            return api_key_index(authorization, self.settings.api_keys)
        except APIError:
            raise RivaError(grpc.StatusCode.UNAUTHENTICATED, "incorrect or missing API key: send the metadata "
                            "'authorization: Bearer <key>'") from None

    async def _read_config(self, config: riva_asr_pb2.RecognitionConfig, prefix: str, *,
                           streaming: bool) -> RecognitionRequest:
        engine = self.serving.engine
        request = read_config(config, prefix, accepts_model=self.settings.accepts_model, streaming=streaming,
                              can_align_words=engine.supports_word_timestamps,
                              can_drop_punctuation="punctuation" in engine.capabilities.served_options,
                              takes_language="language" in engine.capabilities.served_options,
                              hotwords_need_beam=engine.capabilities.hotwords_need_beam)
        if request.options.hotwords and streaming and engine.capabilities.streaming is not None:
            raise invalid(f"{prefix}.speech_contexts", "this model's streams decode greedily: they take no word "
                          "boosting")
        try:
            await engine.check(request.options)
        except UnsupportedOptionError as exc:
            raise invalid(f"{prefix}.{await self._refused_field(request)}", str(exc)) from None
        return request

    async def _refused_field(self, request: RecognitionRequest) -> str:
        """The config field a refused request is refused on: its language, its speech contexts, else its custom
        configuration (each asked alone; only a refused request pays for these checks)."""
        options = request.options
        if options.language is not None and not await self._serves(DecodeOptions(language=options.language)):
            return "language_code"
        if options.hotwords and not await self._serves(DecodeOptions(beam_size=options.beam_size,
                                                                     hotwords=options.hotwords)):
            return "speech_contexts"
        return "custom_configuration"

    async def _serves(self, options: DecodeOptions) -> bool:
        try:
            await self.serving.engine.check(options)
        except UnsupportedOptionError:
            return False
        return True

    # ------------------------------------------------------------------ answers

    async def _answered(self, method: str, work: Awaitable[T], context: grpc.aio.ServicerContext) -> T:
        code = grpc.StatusCode.OK
        try:
            return await work
        except asyncio.CancelledError:  # the client went
            code = grpc.StatusCode.CANCELLED
            raise
        except Exception as exc:
            error = self._status(exc)
            code = error.code
            await context.abort(error.code, error.message)  # raises
            raise
        finally:
            self.requests.labels(method=method, code=code.name).inc()

    def _status(self, exc: Exception) -> RivaError:
        if isinstance(exc, RivaError):
            return exc
        if isinstance(exc, APIError):
            return riva_error(exc)
        log.error("gRPC call failed", exc_info=exc)
        return RivaError(grpc.StatusCode.INTERNAL, "the server failed to answer; see its log")
