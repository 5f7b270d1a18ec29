"""Requests as the scheduler tracks them, and what the engine hands back."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from typing import Any

import numpy as np

from oasr.types import DecodeOptions

# Request priorities: lower is scheduled sooner. Whole files (uploads, offline runs) keep the default; a live
# turn (a committed realtime or gRPC streaming turn) is waited on by someone speaking, so it goes first.
BULK_PRIORITY = 0
INTERACTIVE_PRIORITY = -1


class RequestStatus(enum.Enum):
    WAITING = "waiting"  # queued, holds nothing
    RUNNING = "running"  # encoded: holds a slot and KV blocks, decoding
    FINISHED = "finished"
    ABORTED = "aborted"


class FinishReason(enum.Enum):
    END_OF_TEXT = "end_of_text"
    LENGTH = "length"
    ABORTED = "aborted"


@dataclass
class RequestTimings:
    """Monotonic seconds (``time.perf_counter``)."""

    queued: float = field(default_factory=time.perf_counter)
    encode_start: float | None = None
    encode_end: float | None = None
    first_token: float | None = None
    finished: float | None = None


@dataclass(eq=False)
class Request:
    request_id: str
    audio: np.ndarray  # 16 kHz mono float32, at most one decoding window
    options: DecodeOptions
    # Features computed by the caller (a torch.Tensor [n_mels, frames] on the model's device), used instead of
    # ``audio``'s: sequential long-form slices one log-mel of the whole input as openai-whisper does. Payload
    # only: the scheduler never looks at it (and this module stays free of torch).
    features: Any = None
    prompt_len: int = 0  # decoder prompt tokens (set when added: the model decides)
    num_frames: int = 0  # encoder input frames (for the per-step frame cap)
    max_new_tokens: int = 0  # resolved budget of generated tokens
    # Lower runs sooner: the waiting queue is ordered by it first, and a request that outranks a running one
    # is encoded at once, preempting requests of worse priority when it does not fit (``oasr.engine.scheduler``).
    priority: int = BULK_PRIORITY
    status: RequestStatus = RequestStatus.WAITING
    # Decode rows held while running: one, or one per beam (in beam order), each with its own KV blocks.
    # Empty for families that finish inside the encode walk.
    slots: list[int] = field(default_factory=list)
    block_ids: list[list[int]] = field(default_factory=list)  # per slot
    num_cross_positions: int = 0  # encoder positions held in cross-attention blocks (0: the model holds them per slot)
    cross_block_ids: list[int] = field(default_factory=list)  # shared by all of the request's slots
    output_ids: list[int] = field(default_factory=list)
    # Tokens chosen so far per row, end-of-text excluded. Equals len(output_ids) when decoding greedily; a beam
    # request's output is known only when its search ends, so it counts steps here.
    num_generated: int = 0
    language: str | None = None
    finish_reason: FinishReason | None = None
    sum_logprob: float | None = None  # of the output tokens, end-of-text included (families that report them)
    no_speech_prob: float | None = None  # probability of <|nospeech|> right after <|startoftranscript|>
    # Scheduler bookkeeping.
    arrival_step: int = 0
    num_passed_over: int = 0
    num_preemptions: int = 0
    timings: RequestTimings = field(default_factory=RequestTimings)

    @property
    def is_beam(self) -> bool:
        return self.options.beam_size is not None

    @property
    def num_rows(self) -> int:
        return self.options.num_decode_rows

    @property
    def num_cached(self) -> int:
        """Decoder positions whose K/V is in each row's cache: the prompt and every generated token but the
        newest (every beam of a request is equally long)."""
        return self.prompt_len + max(self.num_generated - 1, 0)

    def reset_for_recompute(self) -> None:
        """Preempted: drop all decode state; the request is encoded and decoded again from scratch."""
        self.status = RequestStatus.WAITING
        self.slots = []
        self.block_ids = []
        self.output_ids = []
        self.num_generated = 0
        self.language = None
        self.sum_logprob = None
        self.no_speech_prob = None
        self.num_passed_over = 0
        self.num_preemptions += 1


@dataclass(frozen=True)
class RequestOutput:
    request_id: str
    token_ids: list[int]
    language: str | None
    finished: bool
    finish_reason: FinishReason | None
    timings: RequestTimings
    # Log-probability of ``token_ids`` and, once finished by end-of-text, of that token too; None from families
    # that do not report it.
    sum_logprob: float | None = None
    no_speech_prob: float | None = None  # set by families that report it (Whisper)

    @property
    def avg_logprob(self) -> float | None:
        """openai-whisper's average: the sum over the tokens and end-of-text, divided by their count."""
        return None if self.sum_logprob is None else self.sum_logprob / (len(self.token_ids) + 1)
