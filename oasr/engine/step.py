"""What one engine step carries: the scheduler's decisions (in ids, slots, blocks and counts) and what the
runner reports back. Plain data, no tensors: the scheduler's tests fabricate both sides."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from oasr.engine.request import RequestOutput
from oasr.streaming.types import StreamEvent


@dataclass(frozen=True)
class EncodeRow:
    """One request to encode. ``slots``: its decode rows (one per beam; none for families that finish inside
    the encode walk); ``block_ids``: each slot's KV blocks."""

    request_id: str
    slots: tuple[int, ...]
    block_ids: tuple[tuple[int, ...], ...]
    cross_block_ids: tuple[int, ...] = ()  # its cross-attention blocks (models attending to their own length)


@dataclass(frozen=True)
class DecodeRow:
    """One running request: its slots (one per beam, in beam order) and each slot's KV blocks."""

    request_id: str
    slots: tuple[int, ...]
    block_ids: tuple[tuple[int, ...], ...]
    num_cached: int  # positions already in each row's cache; the next token is written at this position


@dataclass(frozen=True)
class SchedulerOutput:
    step: int
    encode: tuple[EncodeRow, ...] = ()
    decode: tuple[DecodeRow, ...] = ()
    num_decode_steps: int = 0
    released_slots: tuple[int, ...] = ()  # slots freed since the last step (finished, aborted, preempted)
    preempted: tuple[str, ...] = ()

    @property
    def is_empty(self) -> bool:
        return not self.encode and not self.decode


@dataclass(frozen=True)
class EncodeResult:
    """What the runner reports for one encode row: the first generated token(s) and the language used.
    Families that finish inside the encode walk report every token and ``finished=True``."""

    token_ids: tuple[int, ...]
    language: str | None = None
    finished: bool = False
    logprobs: tuple[float, ...] = ()  # of each of ``token_ids``, where the family reports them
    no_speech_prob: float | None = None


@dataclass(frozen=True)
class BeamResult:
    """A beam search that has ended: the hypothesis the ranker chose, without end-of-text. ``ended``: it ended
    with end-of-text (else it was cut at the request's token budget); ``sum_logprob`` includes end-of-text's."""

    token_ids: tuple[int, ...]
    sum_logprob: float
    ended: bool = True


@dataclass(frozen=True)
class RunnerOutput:
    encoded: dict[str, EncodeResult] = field(default_factory=dict)
    decoded: dict[str, tuple[int, ...]] = field(default_factory=dict)  # num_decode_steps tokens per greedy row
    logprobs: dict[str, tuple[float, ...]] = field(default_factory=dict)  # of the decoded tokens, where reported
    beams: dict[str, BeamResult] = field(default_factory=dict)  # beam requests whose search ended in this step


class PendingStep(Protocol):
    """A launched step (runners that overlap steps): ``wait`` reads its result."""

    def wait(self) -> RunnerOutput: ...


@dataclass(frozen=True)
class StepResult:
    """What one step of an engine returns, whichever work it ran: whole-file requests that changed, and live
    streams that moved."""

    events: list[StreamEvent] = field(default_factory=list)
    outputs: list[RequestOutput] = field(default_factory=list)  # whole-file requests that changed
    chunks: list[tuple[str, int]] = field(default_factory=list)  # (stream id, chunk index) encoded in this step
