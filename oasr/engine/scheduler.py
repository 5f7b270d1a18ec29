"""The scheduler decides each step in request ids, slots, block ids and counts; it never touches a tensor.

A step has up to two walks:
- encode: waiting requests get a slot and KV blocks, run the encoder and the prompt, and produce a first token;
- decode: every running request advances ``num_decode_steps`` tokens.
When both have work the step is *combined*: encode rows are capped lower and the decode walk runs fewer steps,
so a newcomer's first token does not wait behind a long decode tick. The head of the queue is never passed
over more than ``starvation_bound`` steps: when slots or blocks are what keeps it out, the most recently
admitted running request is preempted (its state dropped and recomputed later), once per request at most.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field

from oasr.engine.block_pool import BlockPool
from oasr.engine.config import SchedulerConfig
from oasr.engine.policies import BATCHING_POLICIES
from oasr.engine.request import FinishReason, Request, RequestOutput, RequestStatus


@dataclass(frozen=True)
class EncodeRow:
    request_id: str
    slot: int | None  # None for families that finish inside the encode walk
    block_ids: tuple[int, ...]


@dataclass(frozen=True)
class DecodeRow:
    request_id: str
    slot: int
    block_ids: tuple[int, ...]
    num_cached: int  # positions already in the cache; the next token is written at this position


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
class RunnerOutput:
    encoded: dict[str, EncodeResult] = field(default_factory=dict)
    decoded: dict[str, tuple[int, ...]] = field(default_factory=dict)  # num_decode_steps tokens per row
    logprobs: dict[str, tuple[float, ...]] = field(default_factory=dict)  # of the decoded tokens, where reported


class Scheduler:
    def __init__(
        self, config: SchedulerConfig, pool: BlockPool | None, *, eot: int, max_positions: int, incremental: bool = True
    ) -> None:
        self.config = config
        self.pool = pool
        self.eot = eot
        self.max_positions = max_positions
        self.incremental = incremental
        self.policy = BATCHING_POLICIES.get(config.policy)
        self.requests: dict[str, Request] = {}
        self.waiting: list[Request] = []
        self.running: list[Request] = []  # admission order: the newest is the preemption victim
        self._free_slots = list(range(config.max_num_seqs))
        self._released: list[int] = []
        self._preempted: list[str] = []
        self.step_count = 0

    # ------------------------------------------------------------------ intake and abort

    def add(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in use")
        request.arrival_step = self.step_count
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def abort(self, request_id: str) -> RequestOutput | None:
        request = self.requests.get(request_id)
        if request is None or request.status in (RequestStatus.FINISHED, RequestStatus.ABORTED):
            return None
        if request.status is RequestStatus.WAITING:
            self.waiting.remove(request)
        return self._finish(request, FinishReason.ABORTED)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ------------------------------------------------------------------ schedule

    def schedule(self) -> SchedulerOutput:
        self.step_count += 1
        cfg = self.config
        ordered = self.policy(self.waiting)
        if ordered and ordered[0].num_passed_over >= cfg.starvation_bound:
            self._make_room_for(ordered[0])
        cap = cfg.max_combined_encode_rows if self.running else cfg.max_encode_rows
        encode_now = self._worth_encoding(ordered, cap)
        steps = cfg.combined_decode_steps if encode_now else cfg.decode_steps_per_tick
        decode = self._decode_rows(steps) if self.running else ()
        encode = self._admit(ordered, cap) if encode_now else ()
        if decode and not encode and steps < cfg.decode_steps_per_tick:
            top_up = self._decode_rows(cfg.decode_steps_per_tick, preempt=False)
            if top_up:
                decode, steps = top_up, cfg.decode_steps_per_tick
        admitted = {row.request_id for row in encode}
        for request in self.waiting:
            if request.request_id not in admitted:
                request.num_passed_over += 1
        self.waiting = [r for r in self.waiting if r.request_id not in admitted]
        out = SchedulerOutput(
            step=self.step_count,
            encode=encode,
            decode=decode,
            num_decode_steps=steps if decode else 0,
            released_slots=tuple(self._released),
            preempted=tuple(self._preempted),
        )
        self._released, self._preempted = [], []
        return out

    def _blocks_needed(self, request: Request, num_positions: int) -> int:
        return self.pool.blocks_for(min(num_positions, self.max_positions)) - len(request.block_ids)

    def _decode_rows(self, steps: int, *, preempt: bool = True) -> tuple[DecodeRow, ...]:
        """Grows every running request's blocks to hold ``steps`` more positions; on shortage preempts the newest
        (or, with ``preempt=False``, gives up and returns nothing, leaving blocks as they were)."""
        for request in list(self.running):
            if request.status is not RequestStatus.RUNNING:
                continue  # preempted by an older request's growth in this loop
            while (need := self._blocks_needed(request, request.num_cached + steps)) > 0:
                blocks = self.pool.allocate(need)
                if blocks is not None:
                    request.block_ids.extend(blocks)
                    break
                if not preempt:
                    return ()
                self._preempt(self.running[-1])
                if request.status is not RequestStatus.RUNNING:
                    break
        return tuple(
            DecodeRow(r.request_id, r.slot, tuple(r.block_ids), r.num_cached) for r in self.running
        )

    def _worth_encoding(self, ordered: list[Request], cap: int) -> bool:
        """Encode now? Always when nothing decodes; beside decode rows only once enough rows fit together
        (or the head has waited ``max_encode_delay`` steps), since every encode walk has a fixed cost."""
        if not ordered or not self._can_admit(ordered[0]):
            return False
        if not self.running or ordered[0].num_passed_over >= self.config.max_encode_delay:
            return True
        wanted = min(self.config.min_combined_encode_rows, cap, len(ordered))
        slots = len(self._free_slots) if self.incremental else len(ordered)
        return min(slots, len(ordered), cap) >= wanted

    def _can_admit(self, request: Request) -> bool:
        if not self.incremental:
            return True
        return bool(self._free_slots) and self.pool.num_free >= self.pool.blocks_for(request.prompt_len + 1)

    def _admit(self, ordered: list[Request], cap: int) -> tuple[EncodeRow, ...]:
        rows: list[EncodeRow] = []
        frames = 0
        now = time.perf_counter()
        for request in ordered:
            if len(rows) >= cap or (rows and frames + request.num_frames > self.config.max_encoder_frames):
                break
            if not self._can_admit(request):
                break  # head-of-line: later requests must not overtake one that waits for room
            frames += request.num_frames
            if self.incremental:
                request.slot = heapq.heappop(self._free_slots)
                request.block_ids = self.pool.allocate(self.pool.blocks_for(request.prompt_len + 1)) or []
                self.running.append(request)
            request.status = RequestStatus.RUNNING
            request.timings.encode_start = now
            rows.append(EncodeRow(request.request_id, request.slot, tuple(request.block_ids)))
        return tuple(rows)

    def _make_room_for(self, request: Request) -> None:
        while not self._can_admit(request):
            victims = [r for r in self.running if r.num_preemptions == 0]
            if not victims:
                return
            self._preempt(victims[-1])

    def _preempt(self, request: Request) -> None:
        self._release(request)
        self.running.remove(request)
        request.reset_for_recompute()
        self._preempted.append(request.request_id)
        self.waiting.append(request)

    def _release(self, request: Request) -> None:
        if request.block_ids:
            self.pool.free(request.block_ids)
        if request.slot is not None:
            heapq.heappush(self._free_slots, request.slot)
            self._released.append(request.slot)

    # ------------------------------------------------------------------ update

    def update(self, output: SchedulerOutput, result: RunnerOutput) -> list[RequestOutput]:
        """Applies the runner's tokens; returns an output for every request that changed (finished or not)."""
        now = time.perf_counter()
        changed: list[RequestOutput] = []
        for row in output.encode:
            request = self.requests.get(row.request_id)
            if request is None or request.status is not RequestStatus.RUNNING:
                continue  # aborted while the step ran
            encoded = result.encoded[row.request_id]
            request.timings.encode_end = now
            request.timings.first_token = now
            request.language = encoded.language
            request.no_speech_prob = encoded.no_speech_prob
            changed.append(self._accept(request, encoded.token_ids, encoded.logprobs, done=encoded.finished))
        for row in output.decode:
            request = self.requests.get(row.request_id)
            if request is None or request.status is not RequestStatus.RUNNING:
                continue
            logprobs = result.logprobs.get(row.request_id, ())
            changed.append(self._accept(request, result.decoded[row.request_id], logprobs))
        return changed

    def _accept(
        self, request: Request, tokens: tuple[int, ...], logprobs: tuple[float, ...] = (), *, done: bool = False
    ) -> RequestOutput:
        for i, token in enumerate(tokens):
            if logprobs:
                request.sum_logprob = (request.sum_logprob or 0.0) + logprobs[i]
            if token == self.eot:
                return self._finish(request, FinishReason.END_OF_TEXT)
            request.output_ids.append(token)
            if len(request.output_ids) >= request.max_new_tokens:
                return self._finish(request, FinishReason.LENGTH)
        if done:
            return self._finish(request, FinishReason.END_OF_TEXT)
        return self._snapshot(request)

    def _finish(self, request: Request, reason: FinishReason) -> RequestOutput:
        if request in self.running:
            self.running.remove(request)
        self._release(request)
        request.slot, request.block_ids = None, []
        request.status = RequestStatus.ABORTED if reason is FinishReason.ABORTED else RequestStatus.FINISHED
        request.finish_reason = reason
        request.timings.finished = time.perf_counter()
        del self.requests[request.request_id]
        return self._snapshot(request)

    @staticmethod
    def _snapshot(request: Request) -> RequestOutput:
        return RequestOutput(
            request_id=request.request_id,
            token_ids=list(request.output_ids),
            language=request.language,
            finished=request.status in (RequestStatus.FINISHED, RequestStatus.ABORTED),
            finish_reason=request.finish_reason,
            timings=request.timings,
            sum_logprob=request.sum_logprob,
            no_speech_prob=request.no_speech_prob,
        )
