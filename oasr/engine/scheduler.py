"""The scheduler decides each step in request ids, slots, block ids and counts; it never touches a tensor.

A step has up to two walks:
- encode: waiting requests get a slot and KV blocks, run the encoder and the prompt, and produce a first token;
- decode: every running request advances ``num_decode_steps`` tokens.
When both have work the step is *combined*: encode rows are capped lower and the decode walk runs fewer steps,
so a newcomer's first token does not wait behind a long decode tick. The head of the queue is never passed
over more than ``starvation_bound`` steps: when slots or blocks are what keeps it out, the most recently
admitted running request is preempted (its state dropped and recomputed later), once per request at most.

Requests carry a priority (``Request.priority``, lower sooner; live turns use ``INTERACTIVE_PRIORITY``). The
waiting queue is ordered by it first and by the batching policy within it. A head that outranks some running
request does not wait for a worthwhile combined walk, and when slots or blocks keep it out, running requests of
worse priority are preempted for it (the worst priority first, the newest admitted of it first), as often as it
takes: bulk work yields to turns. A request is never preempted for one of its own or a worse priority, except by
the starvation bound above, which applies within one priority only. Decode-block shortage preempts the same way:
the worst priority first, the newest within it.

A beam-search request holds ``beam_size`` decode rows, each with a slot and KV blocks of its own, from admission
to its end: they are admitted, grown, preempted and freed together. The runner keeps the beams on the device and
reports the request's tokens once its search ends (``RunnerOutput.beams``); until then the scheduler only counts
its steps, and shortens a tick rather than run a search past its token budget.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Sequence

from oasr.engine.block_pool import BlockPool
from oasr.engine.config import SchedulerConfig
from oasr.engine.policies import BATCHING_POLICIES
from oasr.engine.request import FinishReason, Request, RequestOutput, RequestStatus
from oasr.engine.step import BeamResult, DecodeRow, EncodeRow, RunnerOutput, SchedulerOutput

# (the language known at encode, the output tokens) -> the language a finished request is reported in.
LanguageOf = Callable[[str | None, Sequence[int]], str | None]


class Scheduler:
    def __init__(
        self, config: SchedulerConfig, pool: BlockPool | None, *, eot: int, max_positions: int, incremental: bool = True,
        cross_pool: BlockPool | None = None,
        output_language: LanguageOf | None = None,
        stop_tokens: Sequence[int] = (),
    ) -> None:
        self.config = config
        self.pool = pool
        # Cross-attention blocks, for models whose requests attend to their own encoder length (None: held per slot).
        self.cross_pool = cross_pool
        self.eot = eot
        self.end_tokens = frozenset((eot, *stop_tokens))  # any of them ends a request and is not kept
        # The language a finished request is reported in, from the one known at its encode and its output tokens
        # (the runner's ``output_language``: a model may name the language in its output). None: the former.
        self.output_language = output_language
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
        if self.incremental and request.num_rows > 1:
            # A request that could never be admitted, or never grow to its budget alone, would wait forever.
            if request.num_rows > self.config.max_num_seqs:
                raise ValueError(f"{request.num_rows} beams need as many decode rows; the engine has "
                                 f"{self.config.max_num_seqs}")
            blocks = request.num_rows * self.pool.blocks_for(self.max_positions)
            if blocks > self.pool.num_blocks - 1:
                raise ValueError(f"{request.num_rows} beams of {self.max_positions} positions need {blocks} KV "
                                 f"blocks; the pool has {self.pool.num_blocks - 1}")
        if self.cross_pool is not None:
            need = self.cross_pool.blocks_for(request.num_cross_positions)
            if need > self.cross_pool.num_blocks - 1:
                raise ValueError(f"{request.num_cross_positions} encoder positions need {need} cross-attention "
                                 f"blocks; the pool has {self.cross_pool.num_blocks - 1}")
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
        # The priority is an outer sort around the policy's order: sorted() is stable, so within one priority the
        # policy's order stays as it is.
        ordered = sorted(self.policy(self.waiting), key=lambda r: r.priority)
        if ordered:
            self._make_room_for(ordered[0])
        cap = cfg.max_combined_encode_rows if self.running else cfg.max_encode_rows
        encode_now = self._worth_encoding(ordered, cap)
        steps = self._tick_length(cfg.combined_decode_steps if encode_now else cfg.decode_steps_per_tick)
        decode = self._decode_rows(steps) if self.running else ()
        encode = self._admit(ordered, cap) if encode_now else ()
        full_tick = self._tick_length(cfg.decode_steps_per_tick)
        if decode and not encode and steps < full_tick:
            top_up = self._decode_rows(full_tick, preempt=False)
            if top_up:
                decode, steps = top_up, full_tick
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

    def _tick_length(self, steps: int) -> int:
        """``steps``, or fewer so that no beam search runs past its token budget inside the tick: the runner
        ranks a search's live beams at its last step, so that step must end a tick."""
        left = [r.max_new_tokens - r.num_generated for r in self.running if r.is_beam]
        return max(1, min([steps, *left]))

    def _blocks_needed(self, request: Request, num_positions: int) -> int:
        """More blocks each of the request's rows needs to hold ``num_positions`` positions."""
        return self.pool.blocks_for(min(num_positions, self.max_positions)) - len(request.block_ids[0])

    def _decode_rows(self, steps: int, *, preempt: bool = True) -> tuple[DecodeRow, ...]:
        """Grows every running request's blocks to hold ``steps`` more positions; on shortage preempts the newest
        of the worst priority (or, with ``preempt=False``, gives up and returns nothing, leaving blocks as they
        were)."""
        for request in list(self.running):
            if request.status is not RequestStatus.RUNNING:
                continue  # preempted by an older request's growth in this loop
            while (need := self._blocks_needed(request, request.num_cached + steps)) > 0:
                blocks = self.pool.allocate(need * request.num_rows)  # every beam grows, or none
                if blocks is not None:
                    for row, start in zip(request.block_ids, range(0, len(blocks), need), strict=True):
                        row.extend(blocks[start : start + need])
                    break
                if not preempt:
                    return ()
                self._preempt(_newest_of_worst(self.running))
                if request.status is not RequestStatus.RUNNING:
                    break
        return tuple(
            DecodeRow(r.request_id, tuple(r.slots), tuple(map(tuple, r.block_ids)), r.num_cached)
            for r in self.running
        )

    def _worth_encoding(self, ordered: list[Request], cap: int) -> bool:
        """Encode now? Always when nothing decodes; beside decode rows only once enough rows fit together
        (or the head has waited ``max_encode_delay`` steps), since every encode walk has a fixed cost. A head that
        outranks a running request does not wait: a turn's latency is what its priority is for."""
        if not ordered or not self._can_admit(ordered[0]):
            return False
        if not self.running or ordered[0].num_passed_over >= self.config.max_encode_delay:
            return True
        if self._outranks_running(ordered[0]):
            return True
        wanted = min(self.config.min_combined_encode_rows, cap, len(ordered))
        slots = len(self._free_slots) // ordered[0].num_rows if self.incremental else len(ordered)
        return min(slots, len(ordered), cap) >= wanted

    def _can_admit(self, request: Request) -> bool:
        if not self.incremental:
            return True
        rows = request.num_rows
        if self.cross_pool is not None and self.cross_pool.num_free < self.cross_pool.blocks_for(
                request.num_cross_positions):
            return False
        return len(self._free_slots) >= rows and self.pool.num_free >= rows * self.pool.blocks_for(
            request.prompt_len + 1)

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
                per_row = self.pool.blocks_for(request.prompt_len + 1)
                blocks = self.pool.allocate(per_row * request.num_rows) or []  # _can_admit checked the room
                request.slots = [heapq.heappop(self._free_slots) for _ in range(request.num_rows)]
                request.block_ids = [blocks[i : i + per_row] for i in range(0, len(blocks), per_row)]
                if self.cross_pool is not None:  # one set for all of a request's beams: they hear the same audio
                    need = self.cross_pool.blocks_for(request.num_cross_positions)
                    request.cross_block_ids = self.cross_pool.allocate(need) or []
                self.running.append(request)
            request.status = RequestStatus.RUNNING
            request.timings.encode_start = now
            rows.append(EncodeRow(request.request_id, tuple(request.slots), tuple(map(tuple, request.block_ids)),
                                  tuple(request.cross_block_ids)))
        return tuple(rows)

    def _outranks_running(self, request: Request) -> bool:
        return any(r.priority > request.priority for r in self.running)

    def _make_room_for(self, request: Request) -> None:
        """Preempts running requests until ``request`` fits: any of worse priority, and, once it has been passed
        over ``starvation_bound`` steps, those of its own priority not preempted before (a request preempted
        again and again for its equals would never finish). Never one of better priority."""
        starved = request.num_passed_over >= self.config.starvation_bound
        while not self._can_admit(request):
            victims = [r for r in self.running if r.priority > request.priority
                       or (starved and r.priority == request.priority and r.num_preemptions == 0)]
            if not victims:
                return
            self._preempt(_newest_of_worst(victims))

    def _preempt(self, request: Request) -> None:
        self._release(request)
        self.running.remove(request)
        request.reset_for_recompute()
        self._preempted.append(request.request_id)
        self.waiting.append(request)

    def _release(self, request: Request) -> None:
        for blocks in request.block_ids:
            self.pool.free(blocks)
        if request.cross_block_ids:
            self.cross_pool.free(request.cross_block_ids)
            request.cross_block_ids = []
        for slot in request.slots:
            heapq.heappush(self._free_slots, slot)
            self._released.append(slot)

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
            if request.is_beam and self.incremental:  # frame-synchronous searches finish inside the encode walk
                changed += self._advance_beams(request, 1, result.beams.get(row.request_id))
            else:
                changed.append(self._accept(request, encoded.token_ids, encoded.logprobs, done=encoded.finished))
        for row in output.decode:
            request = self.requests.get(row.request_id)
            if request is None or request.status is not RequestStatus.RUNNING:
                continue
            if request.is_beam:
                changed += self._advance_beams(request, output.num_decode_steps, result.beams.get(row.request_id))
                continue
            logprobs = result.logprobs.get(row.request_id, ())
            changed.append(self._accept(request, result.decoded[row.request_id], logprobs))
        return changed

    def _advance_beams(self, request: Request, steps: int, ended: BeamResult | None) -> list[RequestOutput]:
        """A beam request after ``steps`` more steps: its output once the runner ended its search; nothing
        before (the beams' tokens change until the search ends, so there is no partial output to give)."""
        request.num_generated += steps
        if ended is None:
            if request.num_generated >= request.max_new_tokens:
                raise RuntimeError(f"{request.request_id}: the runner did not end a beam search at its token budget")
            return []
        request.output_ids = list(ended.token_ids)
        request.sum_logprob = ended.sum_logprob
        return [self._finish(request, FinishReason.END_OF_TEXT if ended.ended else FinishReason.LENGTH)]

    def _accept(
        self, request: Request, tokens: tuple[int, ...], logprobs: tuple[float, ...] = (), *, done: bool = False
    ) -> RequestOutput:
        for i, token in enumerate(tokens):
            if logprobs:
                request.sum_logprob = (request.sum_logprob or 0.0) + logprobs[i]
            if token in self.end_tokens:
                return self._finish(request, FinishReason.END_OF_TEXT)
            request.output_ids.append(token)
            request.num_generated += 1
            if len(request.output_ids) >= request.max_new_tokens:
                return self._finish(request, FinishReason.LENGTH)
        if done:
            return self._finish(request, FinishReason.END_OF_TEXT)
        return self._snapshot(request)

    def _finish(self, request: Request, reason: FinishReason) -> RequestOutput:
        if request in self.running:
            self.running.remove(request)
        self._release(request)
        request.slots, request.block_ids = [], []
        request.status = RequestStatus.ABORTED if reason is FinishReason.ABORTED else RequestStatus.FINISHED
        request.finish_reason = reason
        request.timings.finished = time.perf_counter()
        if self.output_language is not None and reason is not FinishReason.ABORTED:
            request.language = self.output_language(request.language, request.output_ids)
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


def _newest_of_worst(running: list[Request]) -> Request:
    """The preemption victim among ``running`` (in admission order): the worst priority, the newest admitted of
    it (it has the least decoded to lose)."""
    return max(reversed(running), key=lambda r: r.priority)  # max keeps the first of equals: the newest
