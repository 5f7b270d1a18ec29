"""What a stream is opened with and what it hands back, apart from the engine: torch-free, so the server's API
processes (which import no torch) can open streams in an engine core and read their events."""

from __future__ import annotations

from dataclasses import dataclass

from oasr.errors import OASRError
from oasr.streaming.endpointing import EndpointConfig


class StreamingUnsupportedError(OASRError):
    """The model's encoder cannot stream (it declares no streaming runtime)."""


class StreamCapacityError(OASRError):
    """Every stream slot is taken."""


@dataclass(frozen=True)
class StreamingConfig:
    max_streams: int = 64  # stream slots: each holds one stream's encoder caches and predictor context
    max_batch: int = 1024  # streams encoded in one step, at most
    # Lookaheads whose every batch bucket runs once when the engine is built (on CUDA), so that live steps never
    # pay for first use; None: the checkpoint's default lookahead.
    warm_lookaheads: tuple[int, ...] | None = None
    cuda_graphs: bool = True  # replay each step shape's forward as a CUDA graph (CUDA only; eager elsewhere)
    # The two-pass final: an offline model (embedded name, directory or hub id), loaded beside the streaming one
    # on its device, that transcribes each finished utterance's audio; its text is the utterance's final one
    # (``StreamEvent.final_model``). None: the final is the streamed text.
    final_model: str | None = None

    def __post_init__(self) -> None:
        if self.max_streams < 1 or self.max_batch < 1:
            raise ValueError("max_streams and max_batch must be at least 1")
        if self.final_model is not None and not self.final_model.strip():
            raise ValueError("final_model must name a model (or be None for no second pass)")


@dataclass(frozen=True)
class StreamOptions:
    lookahead: int | None = None  # encoder frames of right context; None: the checkpoint's default
    language: str | None = None  # for models that take a language prompt; None: theirs (often "auto")
    endpointing: EndpointConfig | None = None  # None: one utterance per stream


@dataclass(frozen=True)
class StreamEvent:
    stream_id: str
    utterance: int  # the utterance's index within its stream
    new_token_ids: tuple[int, ...]  # decided in this step
    token_ids: tuple[int, ...]  # the utterance's tokens so far
    text: str  # the utterance's text so far
    start_s: float  # where the utterance begins in the stream's audio
    end_s: float  # audio decided so far (the end of the last encoded chunk)
    final: bool = False  # the utterance is over: no more tokens will join it
    closed: bool = False  # the stream is over: this is its last event
    endpoint: str | None = None  # the endpointing rule that ended the utterance
    # Set on a final event whose text and token ids are the two-pass final's: this model transcribed the
    # utterance's audio, and its text replaces the streamed partials (the token ids are of its tokenizer).
    final_model: str | None = None
