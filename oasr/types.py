"""Public result and option types of the Python API."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Task = Literal["transcribe", "translate"]


@dataclass(frozen=True)
class TranscribeOptions:
    """What to decode. ``language=None`` means the model's only language, or detection on multilingual models."""

    language: str | None = None
    task: Task = "transcribe"
    batch_size: int = 16
    vad: str | None = None  # a registered VAD detector (oasr.vad): long audio is cut at its silences, not every 30 s
    word_timestamps: bool = False  # fill ``Segment.words`` (Whisper checkpoints; costs one more encoder pass)

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.task not in ("transcribe", "translate"):
            raise ValueError(f"task must be 'transcribe' or 'translate', got {self.task!r}")
        if self.vad is not None:
            from oasr.vad import VAD_DETECTORS

            if self.vad not in VAD_DETECTORS:
                raise ValueError(f"unknown VAD detector {self.vad!r}; registered: {', '.join(VAD_DETECTORS.names())}")


@dataclass(frozen=True)
class DecodeOptions:
    """Per-request options. ``language=None`` lets a multilingual model detect it."""

    language: str | None = None
    task: Task = "transcribe"
    max_new_tokens: int | None = None  # default: whatever the decoder's positions allow
    min_new_tokens: int = 0  # end-of-text is suppressed before this many tokens (fixed-length benchmarks)


@dataclass(frozen=True)
class Word:
    """One word and when it was spoken (seconds from the input's start), from cross-attention alignment.
    ``word`` keeps its leading space and any punctuation merged into it, as Whisper's word timestamps do."""

    word: str
    start: float
    end: float
    probability: float


@dataclass(frozen=True)
class Segment:
    """A span of the input with its text. Today one per 30 s decoding window; timestamp decoding refines these."""

    start: float
    end: float
    text: str
    words: tuple[Word, ...] = ()


@dataclass
class Transcription:
    """One input's result. ``error`` is set (and ``text`` empty) when the input could not be transcribed."""

    source: str
    text: str
    language: str | None
    duration_s: float
    token_ids: list[int] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_dict(self) -> dict[str, Any]:
        values = asdict(self)
        return {"file": values.pop("source"), **values}
