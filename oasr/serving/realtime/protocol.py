"""OpenAI's Realtime transcription protocol on the wire: client events read, server events written.

Two dialects share everything but the session. GA (``openai.types.realtime``): ``session.update`` with
``session.type = "transcription"`` and ``session.audio.input.{format, transcription, turn_detection}``, answered
by ``session.created`` / ``session.updated``. Beta (``openai.types.beta.realtime``, header ``OpenAI-Beta:
realtime=v1``): ``transcription_session.update`` with a flat session (``input_audio_format``,
``input_audio_transcription``, ``turn_detection``), answered by ``transcription_session.created`` / ``.updated``.
Either update is accepted on either dialect; answers are in the connection's dialect. Updates are partial: a
field left out keeps its value, ``turn_detection: null`` turns server VAD off.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, replace
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from oasr.serving.protocol import MAX_HOTWORDS_CHARS
from oasr.serving.realtime.audio import AudioFormat
from oasr.serving.realtime.session import TurnDetection

Dialect = Literal["ga", "beta"]
# GA's format objects <-> the beta names, which the session uses.
_GA_FORMATS: dict[str, AudioFormat] = {"audio/pcm": "pcm16", "audio/pcmu": "g711_ulaw", "audio/pcma": "g711_alaw"}
_BETA_TO_GA = {name: ga for ga, name in _GA_FORMATS.items()}
PCM_RATE = 24_000


def new_event_id() -> str:
    return f"event_{secrets.token_hex(12)}"


class ProtocolError(ValueError):
    """A client event the server cannot act on; answered with an ``error`` event, the session goes on."""

    def __init__(self, message: str, *, code: str, param: str | None = None,
                 type: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.message, self.code, self.param, self.type = message, code, param, type


# ------------------------------------------------------------------------------------ the session

@dataclass(frozen=True)
class SessionConfig:
    """What a session transcribes with; changed only by whole updates, each validated first."""

    audio_format: AudioFormat = "pcm16"
    model: str | None = None  # as the client named it (None: the served model)
    language: str | None = None
    prompt: str | None = None
    turn_detection: TurnDetection | None = TurnDetection()  # OpenAI's default: server VAD
    # OASR's extension: "phrase[:boost],..." favoured by a beam search of each committed turn (oasr.decode.hotwords).
    hotwords: str | None = None


class _Open(BaseModel):
    model_config = ConfigDict(extra="ignore")


class _Transcription(_Open):
    model: str | None = None
    language: str | None = None
    prompt: str | None = None
    hotwords: str | None = Field(default=None, max_length=MAX_HOTWORDS_CHARS)


class _TurnDetection(_Open):
    type: Literal["server_vad", "semantic_vad"] = "server_vad"
    threshold: float | None = None
    prefix_padding_ms: int | None = None
    silence_duration_ms: int | None = None


class _GAFormat(_Open):
    type: Literal["audio/pcm", "audio/pcmu", "audio/pcma"]
    rate: int | None = None


class _GAInput(_Open):
    format: _GAFormat | None = None
    transcription: _Transcription | None = None
    turn_detection: _TurnDetection | None = None
    noise_reduction: dict[str, Any] | None = None


class _GAAudio(_Open):
    input: _GAInput | None = None


class _GASession(_Open):
    type: Literal["transcription"]
    audio: _GAAudio | None = None
    include: list[str] | None = None


class _BetaSession(_Open):
    input_audio_format: Literal["pcm16", "g711_ulaw", "g711_alaw"] | None = None
    input_audio_transcription: _Transcription | None = None
    turn_detection: _TurnDetection | None = None
    input_audio_noise_reduction: dict[str, Any] | None = None
    include: list[str] | None = None


def updated_config(config: SessionConfig, event: dict[str, Any]) -> SessionConfig:
    """``config`` with a ``session.update`` or ``transcription_session.update`` applied; raises
    ``ProtocolError`` naming the field it refuses."""
    session = event.get("session")
    if not isinstance(session, dict):
        raise ProtocolError("The update has no 'session' object.", code="invalid_value", param="session")
    if event["type"] == "session.update":
        parsed = _parse(_GASession, session, "session")
        audio_input = parsed.audio.input if parsed.audio is not None else None
        fields = audio_input.model_fields_set if audio_input is not None else set()
        prefix = "session.audio.input"
        if audio_input is not None and audio_input.format is not None:
            fmt = audio_input.format
            if fmt.type == "audio/pcm" and fmt.rate not in (None, PCM_RATE):
                raise ProtocolError(f"audio/pcm is accepted at {PCM_RATE} Hz only, not {fmt.rate}.",
                                    code="invalid_value", param=f"{prefix}.format.rate")
            config = replace(config, audio_format=_GA_FORMATS[fmt.type])
        transcription = audio_input.transcription if audio_input is not None else None
        turn_detection = audio_input.turn_detection if audio_input is not None else None
        noise = audio_input.noise_reduction if audio_input is not None else None
        include = parsed.include
    else:
        parsed = _parse(_BetaSession, session, "session")
        fields = parsed.model_fields_set
        prefix = "session"
        if parsed.input_audio_format is not None:
            config = replace(config, audio_format=parsed.input_audio_format)
        transcription, turn_detection = parsed.input_audio_transcription, parsed.turn_detection
        noise, include = parsed.input_audio_noise_reduction, parsed.include
    if noise is not None:
        raise ProtocolError("Noise reduction is not offered by this server; leave it out or set it to null.",
                            code="unsupported_option", param=f"{prefix}.noise_reduction")
    if include:
        raise ProtocolError("This server gives no logprobs; leave 'include' out.", code="unsupported_option",
                            param="session.include")
    if transcription is not None:
        config = replace(config, **{k: getattr(transcription, k) for k in transcription.model_fields_set})
    if "turn_detection" in fields:
        config = replace(config, turn_detection=_turn_detection(turn_detection, config.turn_detection,
                                                                f"{prefix}.turn_detection"))
    return config


def _turn_detection(given: _TurnDetection | None, current: TurnDetection | None, param: str) -> TurnDetection | None:
    if given is None:
        return None
    if given.type != "server_vad":
        raise ProtocolError("Only 'server_vad' turn detection (or null, to commit by hand) is offered by this "
                            "server.", code="unsupported_option", param=f"{param}.type")
    base = current or TurnDetection()
    values = {k: getattr(given, k) for k in ("threshold", "prefix_padding_ms", "silence_duration_ms")
              if getattr(given, k) is not None}
    try:
        return replace(base, **values)
    except ValueError as exc:
        name = next((k for k in values if k in str(exc)), None)
        raise ProtocolError(f"{exc}.", code="invalid_value", param=f"{param}.{name}" if name else param) from None


def _parse(model: type[BaseModel], data: dict[str, Any], where: str) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join([where, *(str(part) for part in first["loc"])])
        raise ProtocolError(f"Invalid value for '{param}': {first['msg']}.", code="invalid_value",
                            param=param) from None


def session_object(config: SessionConfig, session_id: str, model: str, dialect: Dialect) -> dict[str, Any]:
    """The session as ``session.created`` / ``.updated`` (GA) or ``transcription_session.*`` (beta) show it."""
    transcription = {"model": config.model or model, "language": config.language, "prompt": config.prompt}
    td = config.turn_detection
    turn_detection = None if td is None else {"type": "server_vad", "threshold": td.threshold,
                                              "prefix_padding_ms": td.prefix_padding_ms,
                                              "silence_duration_ms": td.silence_duration_ms}
    if dialect == "beta":
        return {"id": session_id, "object": "realtime.transcription_session", "modalities": ["text"],
                "input_audio_format": config.audio_format, "input_audio_transcription": transcription,
                "turn_detection": turn_detection, "input_audio_noise_reduction": None}
    fmt: dict[str, Any] = {"type": _BETA_TO_GA[config.audio_format]}
    if config.audio_format == "pcm16":
        fmt["rate"] = PCM_RATE
    return {"type": "transcription", "id": session_id, "object": "realtime.transcription_session",
            "audio": {"input": {"format": fmt, "transcription": transcription, "turn_detection": turn_detection,
                                "noise_reduction": None}},
            "include": None}


# ------------------------------------------------------------------------------------ server events

class ServerEvent(BaseModel):
    event_id: str = Field(default_factory=new_event_id)


class SessionEvent(ServerEvent):
    type: Literal["session.created", "session.updated", "transcription_session.created",
                  "transcription_session.updated"]
    session: dict[str, Any]


class SpeechStartedEvent(ServerEvent):
    type: Literal["input_audio_buffer.speech_started"] = "input_audio_buffer.speech_started"
    item_id: str
    audio_start_ms: int


class SpeechStoppedEvent(ServerEvent):
    type: Literal["input_audio_buffer.speech_stopped"] = "input_audio_buffer.speech_stopped"
    item_id: str
    audio_end_ms: int


class CommittedEvent(ServerEvent):
    type: Literal["input_audio_buffer.committed"] = "input_audio_buffer.committed"
    item_id: str
    previous_item_id: str | None = None


class ClearedEvent(ServerEvent):
    type: Literal["input_audio_buffer.cleared"] = "input_audio_buffer.cleared"


class TranscriptDeltaEvent(ServerEvent):
    type: Literal["conversation.item.input_audio_transcription.delta"] = \
        "conversation.item.input_audio_transcription.delta"
    item_id: str
    content_index: int = 0
    delta: str


class DurationUsage(BaseModel):
    type: Literal["duration"] = "duration"
    seconds: float


class TranscriptCompletedEvent(ServerEvent):
    type: Literal["conversation.item.input_audio_transcription.completed"] = \
        "conversation.item.input_audio_transcription.completed"
    item_id: str
    content_index: int = 0
    transcript: str
    usage: DurationUsage


class ErrorDetail(BaseModel):
    type: str
    code: str | None = None
    message: str
    param: str | None = None
    event_id: str | None = None  # the client event that caused it


class TranscriptFailedEvent(ServerEvent):
    type: Literal["conversation.item.input_audio_transcription.failed"] = \
        "conversation.item.input_audio_transcription.failed"
    item_id: str
    content_index: int = 0
    error: ErrorDetail


class ErrorEvent(ServerEvent):
    type: Literal["error"] = "error"
    error: ErrorDetail

    @classmethod
    def of(cls, exc: ProtocolError, client_event_id: str | None = None) -> ErrorEvent:
        return cls(error=ErrorDetail(type=exc.type, code=exc.code, message=exc.message, param=exc.param,
                                     event_id=client_event_id))
