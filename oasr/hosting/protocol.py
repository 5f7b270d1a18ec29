"""What an engine core and its clients say to each other, whichever transport carries it (a queue in-process,
two ZeroMQ sockets per client to a core process, Ray calls to a replica).

client -> core: ``AddRequest`` (its audio travels as a second frame of raw float32 bytes),
``AbortRequests``, ``CheckOptions``, ``AlignWords`` and ``Diarize`` (audio as for ``AddRequest``), ``StopCore``; for a model
that streams, ``OpenStream``, ``PushAudio`` (16 kHz float32 samples as the second frame), ``CloseStream`` and
``AbortStreams``. Core -> client: first ``CoreReady`` or ``CoreFailed``, then one ``CoreUpdate`` per
loop iteration that had anything to say (requests' tokens, streams' ``StreamEvent``s and failures), and
``CoreFailed`` if the loop dies. Messages are pickled: both ends are the same program,
on sockets in a directory only this user can open.
"""

from __future__ import annotations

import logging
import pickle
from dataclasses import dataclass
from typing import Any

from oasr.diarization.types import SpeakerSegment
from oasr.engine.config import EngineConfig
from oasr.engine.stats import EngineStats
from oasr.engine.request import BULK_PRIORITY, FinishReason, RequestTimings
from oasr.models.base import AlignmentRow
from oasr.models.capabilities import ModelCapabilities
from oasr.streaming.types import StreamEvent, StreamingConfig, StreamOptions
from oasr.types import DecodeOptions, Word

# Error kinds a request can fail with in the core; the client raises the matching error class.
UNSUPPORTED_OPTION = "unsupported_option"
INVALID_REQUEST = "invalid_request"
INTERNAL_ERROR = "internal_error"  # the core failed at something it was asked (logged there)
STREAM_CAPACITY = "stream_capacity"  # every stream slot is taken


@dataclass(frozen=True)
class EngineCoreSpec:
    """Everything the core process needs to build its engine (it loads the model itself)."""

    model: str  # embedded model name or model directory
    device: str = "auto"
    dtype: str | None = None
    config: EngineConfig | None = None
    log_level: int = logging.WARNING
    # torch's CPU threads in the core (None: torch's default). One suits a CPU shared with other work: a
    # multi-threaded step whose threads wait at barriers for a descheduled sibling runs several times slower.
    cpu_threads: int | None = None
    streaming: StreamingConfig | None = None  # a streaming model's stream slots (None: StreamingConfig())
    quantization: str | None = None  # a method to quantize a full-precision checkpoint with at load
    # A diarization checkpoint the core serves beside the model (``Diarize``), on the same device (None: none).
    diarization_model: str | None = None


@dataclass(frozen=True)
class EngineInfo:
    """What the API process needs to know of the loaded model, sent once the core is ready."""

    model_name: str
    device: str
    window_samples: int
    tokenizer: Any  # the model's tokenizer (picklable): the API process turns token ids into text
    stats: EngineStats
    supports_word_timestamps: bool = False  # the core answers ``AlignWords``
    capabilities: ModelCapabilities | None = None  # the served architecture's record (how the server cuts audio)
    pid: int | None = None  # the process the core runs in
    core_class: str = ""  # the class serving (every host runs ``oasr.hosting.core.EngineCore``)
    diarization_model: str | None = None  # the diarization checkpoint the core answers ``Diarize`` with


# ----------------------------------------------------------------------------------- API -> core


@dataclass(frozen=True)
class AddRequest:
    request_id: str
    options: DecodeOptions
    partial: bool  # send every new token as it comes (streaming); else only the finished result
    priority: int = BULK_PRIORITY  # lower is scheduled sooner (``Request.priority``; a live turn's is lower)


@dataclass(frozen=True)
class AbortRequests:
    request_ids: tuple[str, ...]


@dataclass(frozen=True)
class CheckOptions:
    call_id: int
    options: DecodeOptions


@dataclass(frozen=True)
class AlignWords:
    """Word timestamps for one input's decoded windows (``oasr.transcription.words``), one row per window, in order.
    The windows' audio travels as one second frame, concatenated, ``num_samples`` of it per window."""

    call_id: int
    rows: tuple[AlignmentRow, ...]
    num_samples: tuple[int, ...]


@dataclass(frozen=True)
class Diarize:
    """Who speaks when in one input (the core's diarization model): its audio, 16 kHz mono float32, travels as
    the message's second frame; a frame above ``threshold`` is a speaker's speech."""

    call_id: int
    threshold: float


@dataclass(frozen=True)
class OpenStream:
    """A live stream (the served model must stream); its failure to open comes back as a ``StreamFailed``."""

    stream_id: str
    options: StreamOptions


@dataclass(frozen=True)
class PushAudio:
    """More of a stream's audio: 16 kHz mono float32, the message's second frame."""

    stream_id: str


@dataclass(frozen=True)
class CloseStream:
    """No more audio: the stream's last chunk is decoded and its last event has ``closed``."""

    stream_id: str


@dataclass(frozen=True)
class AbortStreams:
    """Ends these streams now, freeing their slots; they get no more events."""

    stream_ids: tuple[str, ...]


@dataclass(frozen=True)
class StopCore:
    pass


# ----------------------------------------------------------------------------------- core -> API


@dataclass(frozen=True)
class CoreReady:
    info: EngineInfo


@dataclass(frozen=True)
class CoreFailed:
    message: str  # why the core could not start, or why its loop stopped


@dataclass(frozen=True)
class TokenDelta:
    """A request's tokens since its last delta; a finished request's last delta carries its timings."""

    request_id: str
    new_token_ids: tuple[int, ...]
    language: str | None
    finished: bool
    finish_reason: FinishReason | None
    timings: RequestTimings | None
    # What the decode measured, on a finished delta from families that report it (Whisper).
    sum_logprob: float | None = None
    no_speech_prob: float | None = None


@dataclass(frozen=True)
class RequestFailed:
    request_id: str
    kind: str  # UNSUPPORTED_OPTION or INVALID_REQUEST
    message: str


@dataclass(frozen=True)
class CheckResult:
    call_id: int
    error: str | None  # the ``UnsupportedOptionError`` message, or None when the options can be served


@dataclass(frozen=True)
class AlignResult:
    call_id: int
    words: tuple[tuple[Word, ...], ...] = ()  # per row of the ``AlignWords``, in order
    error_kind: str | None = None  # UNSUPPORTED_OPTION, INVALID_REQUEST or INTERNAL_ERROR when it failed
    error: str | None = None


@dataclass(frozen=True)
class DiarizeResult:
    call_id: int
    segments: tuple[SpeakerSegment, ...] = ()
    error_kind: str | None = None  # UNSUPPORTED_OPTION (no diarization model) or INTERNAL_ERROR when it failed
    error: str | None = None


@dataclass(frozen=True)
class StreamFailed:
    """A stream the core could not open (or keep): it is gone there, and gets no events."""

    stream_id: str
    kind: str  # STREAM_CAPACITY, UNSUPPORTED_OPTION or INVALID_REQUEST
    message: str


@dataclass(frozen=True)
class CoreUpdate:
    deltas: tuple[TokenDelta, ...] = ()
    failures: tuple[RequestFailed, ...] = ()
    checks: tuple[CheckResult, ...] = ()
    alignments: tuple[AlignResult, ...] = ()
    stats: EngineStats | None = None  # sent when it changed since the last update
    stream_events: tuple[StreamEvent, ...] = ()  # in the order the engine stepped them
    stream_failures: tuple[StreamFailed, ...] = ()
    diarizations: tuple[DiarizeResult, ...] = ()


def dumps(message: object) -> bytes:
    return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


def loads(data: bytes | memoryview) -> Any:
    return pickle.loads(data)
