"""Public result and option types of the Python API."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Task = Literal["transcribe", "translate"]
LongForm = Literal["parallel", "sequential"]
LONG_FORM_MODES = ("parallel", "sequential")


@dataclass(frozen=True)
class FallbackOptions:
    """openai-whisper's checks on each window of sequential long-form decoding. A window whose text compresses
    too well (``compression_ratio_threshold``: repetition loops) or whose average token log-probability is too
    low (``logprob_threshold``) is decoded again at the next of ``temperatures``. A window whose ``<|nospeech|>``
    probability exceeds ``no_speech_threshold`` while its log-probability is low is taken as silence and
    skipped. ``temperatures=(0.0,)`` turns the fallback off (the no-speech check still applies); ``None``
    disables a check."""

    temperatures: tuple[float, ...] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
    compression_ratio_threshold: float | None = 2.4
    logprob_threshold: float | None = -1.0
    no_speech_threshold: float | None = 0.6

    def __post_init__(self) -> None:
        if not self.temperatures or any(not 0.0 <= t <= 2.0 for t in self.temperatures):
            raise ValueError(f"temperatures must be a non-empty tuple of values in [0, 2], got {self.temperatures}")


@dataclass(frozen=True)
class TranscribeOptions:
    """What to decode. ``language=None`` means the model's only language, or detection on multilingual models."""

    language: str | None = None
    task: Task = "transcribe"
    batch_size: int = 16
    vad: str | None = None  # a registered VAD detector (oasr.vad): long audio is cut at its silences, not every 30 s
    word_timestamps: bool = False  # fill ``Segment.words`` (Whisper checkpoints; costs one more encoder pass)
    # "parallel": audio longer than one window is cut into consecutive 30 s windows decoded independently (fast);
    # "sequential": openai-whisper's loop, each window starting at the last timestamp of the one before and
    # conditioned on its text (always with timestamps).
    long_form: LongForm = "parallel"
    timestamps: bool = False  # timestamp tokens -> segments with real start/end (always on in sequential mode)
    prompt: str | None = None  # text the first window (sequential) or every window (parallel) is conditioned on
    condition_on_previous_text: bool = True  # sequential: each window sees the text decoded before it
    fallback: FallbackOptions = field(default_factory=FallbackOptions)  # sequential only

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.task not in ("transcribe", "translate"):
            raise ValueError(f"task must be 'transcribe' or 'translate', got {self.task!r}")
        if self.vad is not None:
            from oasr.vad import VAD_DETECTORS

            if self.vad not in VAD_DETECTORS:
                raise ValueError(f"unknown VAD detector {self.vad!r}; registered: {', '.join(VAD_DETECTORS.names())}")
        if self.long_form not in LONG_FORM_MODES:
            raise ValueError(f"long_form must be one of {', '.join(LONG_FORM_MODES)}, got {self.long_form!r}")
        if self.vad is not None and self.long_form == "sequential":
            raise ValueError("vad cuts windows for the parallel long-form mode; sequential mode seeks by timestamps")


@dataclass(frozen=True)
class DecodeOptions:
    """Per-request options. ``language=None`` lets a multilingual model detect it."""

    language: str | None = None
    task: Task = "transcribe"
    max_new_tokens: int | None = None  # default: whatever the decoder's positions allow
    min_new_tokens: int = 0  # end-of-text is suppressed before this many tokens (fixed-length benchmarks)
    timestamps: bool = False  # decode timestamp tokens (openai-whisper's rules) instead of <|notimestamps|>
    temperature: float = 0.0  # 0: greedy; above: sampling from softmax(logits / temperature)
    # Text to condition on, placed after <|startofprev|> (openai-whisper's ``prompt``): either plain text or,
    # as the long-form driver passes previous windows' output, token ids. At most one of the two.
    prompt: str | None = None
    prompt_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.prompt is not None and self.prompt_token_ids:
            raise ValueError("give the prompt as text or as token ids, not both")


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
    """A span of the input with its text (stripped). With timestamps, one per pair of timestamp tokens;
    without, one per 30 s decoding window. The decoding details are those of the window it came from
    (``None`` where the decode did not report them)."""

    start: float
    end: float
    text: str
    words: tuple[Word, ...] = ()
    token_ids: tuple[int, ...] = ()  # as decoded, timestamp tokens included
    temperature: float = 0.0
    avg_logprob: float | None = None
    compression_ratio: float | None = None
    no_speech_prob: float | None = None


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
