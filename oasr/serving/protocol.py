"""OpenAI's audio API on the wire: request fields, response bodies, stream events and the error shape.

Shapes follow the ``openai`` Python package's types (``openai.types.audio``): ``Transcription``,
``TranscriptionVerbose``/``TranslationVerbose`` with ``TranscriptionSegment`` and ``TranscriptionWord``, and the
stream events ``transcript.text.delta`` / ``transcript.text.done``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

# diarized_json: OpenAI's speaker-labelled transcript, served with ``oasr serve --diarization-model``
ResponseFormat = Literal["json", "text", "srt", "vtt", "verbose_json", "diarized_json"]
Granularity = Literal["word", "segment"]
LIST_FIELDS = ("timestamp_granularities",)  # sent as ``name[]`` (repeated) by OpenAI's clients


class APIError(Exception):
    """An error answered in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param
        self.headers = headers or {}

    def body(self) -> dict:
        return ErrorResponse(error=ErrorInfo(message=self.message, type=self.type, param=self.param,
                                             code=self.code)).model_dump()


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo


def internal_error() -> APIError:
    """What a server-side failure tells the client: nothing about where or why (that goes to the log)."""
    return APIError(500, "The server had an error while processing your request.", type="server_error")


# ---------------------------------------------------------------------------------------------- requests


MAX_BEAM_SIZE = 16  # a beam takes one decode row per hypothesis; wider beams would crowd out other requests


MAX_HOTWORDS_CHARS = 10_000  # a few hundred phrases: the automaton is compiled per distinct list


class TranslationParams(BaseModel):
    """The form fields of ``POST /v1/audio/translations`` (besides ``file``). Unknown fields are refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str
    # The spoken language. OpenAI's translations route has none (Whisper detects it); OASR takes it there too,
    # for models that cannot detect it (Canary).
    language: str | None = None
    prompt: str | None = None  # text the decoder is conditioned on (openai-whisper's ``initial_prompt``)
    response_format: ResponseFormat = "json"
    temperature: float = Field(default=0.0, ge=0.0, le=1.0)  # 0: greedy; above: sampling at that temperature
    # OASR's extensions (not in OpenAI's API): beam search as openai-whisper's ``beam_size``/``patience``/
    # ``length_penalty``; at temperature 0 only.
    beam_size: int | None = Field(default=None, ge=1, le=MAX_BEAM_SIZE)
    patience: float | None = Field(default=None, gt=0.0, le=MAX_BEAM_SIZE)
    length_penalty: float | None = Field(default=None, ge=0.0, le=1.0)
    # Hotwords for a beam search, "phrase[:boost],..." (not "@FILE": a client names no file on the server).
    hotwords: str | None = Field(default=None, max_length=MAX_HOTWORDS_CHARS)
    # Attention rescoring of the beam's n-best (CTC + attention models): the attention score's share, with beam_size.
    rescore_weight: float | None = Field(default=None, ge=0.0, le=1.0)


class TranscriptionParams(TranslationParams):
    """The form fields of ``POST /v1/audio/transcriptions`` (besides ``file``)."""

    # OASR's extension: the language to write, on models that translate between many (Canary); the
    # translations route means English.
    target_language: str | None = None
    timestamp_granularities: list[Granularity] = Field(default_factory=list)
    stream: bool = False


def form_request_body(params: type[TranslationParams]) -> dict:
    """An audio route's request body for OpenAPI (``openapi_extra``): the multipart form it parses by hand,
    ``file`` and the fields of ``params``. A form sends no nulls, so an optional field is just not required;
    list fields are named ``name[]``, as OpenAI's clients send them."""
    schema = params.model_json_schema()
    properties: dict[str, dict] = {"file": {"type": "string", "format": "binary", "title": "File",
                                            "description": "The audio (wav, flac, mp3, ogg, opus, m4a, webm ...)"}}
    for name, field in schema["properties"].items():
        field = dict(field)
        branches = [branch for branch in field.pop("anyOf", ()) if branch.get("type") != "null"]
        if branches:
            field.update(branches[0])
        if "default" in field and field["default"] is None:
            del field["default"]
        properties[f"{name}[]" if name in LIST_FIELDS else name] = field
    form = {"type": "object", "properties": properties, "required": ["file", *schema.get("required", ())]}
    return {"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": form}}}}


def validation_error(exc: ValidationError) -> APIError:
    """The first problem pydantic found, named after the form field (OpenAI answers one at a time)."""
    first = exc.errors(include_url=False, include_input=False)[0]
    param = str(first["loc"][0]) if first["loc"] else None
    if first["type"] == "extra_forbidden":
        return APIError(400, f"Unrecognized request argument supplied: {param}", param=param)
    if first["type"] == "missing":
        return APIError(400, f"Missing required parameter: '{param}'.", param=param)
    return APIError(400, f"Invalid value for '{param}': {first['msg']}.", param=param, code="invalid_value")


# --------------------------------------------------------------------------------------------- responses


class Usage(BaseModel):
    type: Literal["duration"] = "duration"
    seconds: float


class TranscriptionResponse(BaseModel):
    """``response_format=json``."""

    text: str
    usage: Usage | None = None


class VerboseSegment(BaseModel):
    """A span closed by timestamp tokens, or one decoding window. ``avg_logprob`` and ``no_speech_prob`` are
    the engine's, measured over the segment's window; null for models that do not report them (a made-up
    number would mislead the thresholds clients apply to them)."""

    id: int
    seek: int  # the window's start in 10 ms feature frames, as Whisper counts it
    start: float
    end: float
    text: str
    tokens: list[int]
    temperature: float  # the request's
    avg_logprob: float | None
    compression_ratio: float
    no_speech_prob: float | None


class VerboseWord(BaseModel):
    """One word and when it was spoken (seconds from the start), without the leading space, as OpenAI's."""

    word: str
    start: float
    end: float


class VerboseTranscriptionResponse(BaseModel):
    """``response_format=verbose_json``. ``segments`` are left out when only word granularity was asked for,
    ``words`` unless it was (as OpenAI answers)."""

    task: Literal["transcribe", "translate"]
    language: str
    duration: float
    text: str
    segments: list[VerboseSegment] | None = None
    words: list[VerboseWord] | None = None
    usage: Usage | None = None
    # What a model that tags its output heard beside the words (SenseVoice: "NEUTRAL", "Speech"); left out
    # for models that write no such tags.
    emotion: str | None = None
    event: str | None = None


class TextDeltaEvent(BaseModel):
    type: Literal["transcript.text.delta"] = "transcript.text.delta"
    delta: str


class TextDoneEvent(BaseModel):
    type: Literal["transcript.text.done"] = "transcript.text.done"
    text: str


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "oasr"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
