"""Beam-search requests in the scheduler, on CPU with a fabricated runner: a request of beam size N holds N decode
rows and N rows of KV blocks from admission to its end, they grow and are freed together, and no row is lost
under random load, aborts and preemption beside greedy requests."""

from __future__ import annotations

import random

import numpy as np
import pytest

from oasr.engine.block_pool import BlockPool
from oasr.engine.config import SchedulerConfig
from oasr.engine.request import FinishReason, Request
from oasr.engine.scheduler import Scheduler
from oasr.engine.step import BeamResult, EncodeResult, RunnerOutput, SchedulerOutput
from oasr.types import DecodeOptions
from test_scheduler import EOT, MAX_POSITIONS, PROMPT, assert_rows_distinct, token

BLOCK_SIZE = 16


def make_request(request_id: str, beam_size: int | None = None, *, max_new_tokens: int = 400) -> Request:
    return Request(
        request_id=request_id,
        audio=np.zeros(160, dtype=np.float32),
        options=DecodeOptions(beam_size=beam_size),
        prompt_len=PROMPT,
        num_frames=3000,
        max_new_tokens=max_new_tokens,
    )


def beam_tokens(request_id: str, count: int) -> tuple[int, ...]:
    return tuple(2000 + i for i in range(count))


class BeamFakeRunner:
    """Answers greedy rows token by token like ``test_scheduler.FakeRunner``; a beam request's search ends with
    ``lengths[id]`` tokens at the step that chooses end-of-text, or at its token budget, never later."""

    def __init__(self, lengths: dict[str, int], requests: dict[str, Request]) -> None:
        self.lengths = lengths
        self.requests = requests  # every request ever added, for its options and budget
        self.produced: dict[str, int] = {}
        self.ended: set[str] = set()

    def execute(self, out: SchedulerOutput) -> RunnerOutput:
        encoded, decoded, beams = {}, {}, {}
        for row in out.encode:
            request = self.requests[row.request_id]
            assert len(row.slots) == request.num_rows == len(row.block_ids)
            assert all(len(t) == -(-(PROMPT + 1) // BLOCK_SIZE) for t in row.block_ids)
            self.produced[row.request_id] = 1
            if request.is_beam:
                encoded[row.request_id] = EncodeResult((), "en")
                self._maybe_end(request, beams)
            else:
                encoded[row.request_id] = EncodeResult((token(row.request_id, 0, self.lengths),), "en")
        for row in out.decode:
            request = self.requests[row.request_id]
            assert row.request_id not in self.ended, "a finished search was decoded again"
            assert len({len(t) for t in row.block_ids}) == 1, "beam rows grew unevenly"
            # Every row has a block for each position the tick writes.
            assert len(row.block_ids[0]) * BLOCK_SIZE >= min(row.num_cached + out.num_decode_steps, MAX_POSITIONS)
            start = self.produced[row.request_id]
            self.produced[row.request_id] = start + out.num_decode_steps
            if request.is_beam:
                assert self.produced[row.request_id] <= request.max_new_tokens, "a tick ran past a beam's budget"
                self._maybe_end(request, beams)
            else:
                decoded[row.request_id] = tuple(
                    token(row.request_id, start + i, self.lengths) for i in range(out.num_decode_steps)
                )
        return RunnerOutput(encoded=encoded, decoded=decoded, beams=beams)

    def _maybe_end(self, request: Request, beams: dict[str, BeamResult]) -> None:
        produced, length = self.produced[request.request_id], self.lengths[request.request_id]
        if produced > length:  # end-of-text was chosen at step ``length``
            beams[request.request_id] = BeamResult(beam_tokens(request.request_id, length), -1.0)
        elif produced == request.max_new_tokens:
            beams[request.request_id] = BeamResult(beam_tokens(request.request_id, produced), -2.0, ended=False)
        else:
            return
        self.ended.add(request.request_id)


class Harness:
    def __init__(self, num_blocks: int = 1000, **overrides) -> None:
        config = SchedulerConfig(**{"max_num_seqs": 8, "max_encode_rows": 4, "max_combined_encode_rows": 2,
                                    **overrides})
        self.scheduler = Scheduler(config, BlockPool(num_blocks, BLOCK_SIZE), eot=EOT, max_positions=MAX_POSITIONS)
        self.requests: dict[str, Request] = {}
        self.lengths: dict[str, int] = {}
        self.runner = BeamFakeRunner(self.lengths, self.requests)
        self.finished: dict[str, object] = {}

    def add(self, request_id: str, length: int, beam_size: int | None = None, **kwargs) -> None:
        request = make_request(request_id, beam_size, **kwargs)
        self.requests[request_id] = request
        self.lengths[request_id] = length
        self.runner.ended.discard(request_id)
        self.scheduler.add(request)

    def step(self) -> SchedulerOutput:
        out = self.scheduler.schedule()
        assert_rows_distinct(out)
        self.check_accounting()
        for request_id in out.preempted:
            self.runner.ended.discard(request_id)
        for output in self.scheduler.update(out, self.runner.execute(out)):
            if not output.finished:
                assert not self.requests[output.request_id].is_beam, "a beam request reported a partial output"
                continue
            assert output.request_id not in self.finished, "a request finished twice"
            self.finished[output.request_id] = output
        return out

    def check_accounting(self) -> None:
        s = self.scheduler
        held_slots = [slot for r in s.running for slot in r.slots]
        assert len(held_slots) + len(s._free_slots) == s.config.max_num_seqs
        assert sorted(held_slots + s._free_slots) == list(range(s.config.max_num_seqs))
        assert sum(len(t) for r in s.running for t in r.block_ids) == s.pool.num_used
        assert all(len(r.slots) == len(r.block_ids) == r.num_rows for r in s.running)

    def drain(self, max_steps: int = 10_000) -> None:
        for _ in range(max_steps):
            if not self.scheduler.has_work:
                return
            self.step()
        raise AssertionError("scheduler did not drain")

    def assert_all_returned(self) -> None:
        s = self.scheduler
        assert s.pool.num_used == 0 and sorted(s._free_slots) == list(range(s.config.max_num_seqs))


def test_a_beam_request_holds_one_row_and_blocks_per_beam_until_its_search_ends() -> None:
    h = Harness()
    h.add("beam", 30, beam_size=3)
    h.add("greedy", 10)
    out = h.step()
    rows = {row.request_id: row for row in out.encode}
    assert len(rows["beam"].slots) == 3 and len(rows["greedy"].slots) == 1
    assert h.scheduler.pool.num_used == 4 and len(h.scheduler._free_slots) == 4
    h.drain()
    assert h.finished["beam"].token_ids == list(beam_tokens("beam", 30))
    assert h.finished["beam"].finish_reason is FinishReason.END_OF_TEXT and h.finished["beam"].sum_logprob == -1.0
    assert h.finished["greedy"].token_ids == [1000 + i for i in range(10)]
    h.assert_all_returned()


def test_beam_size_one_goes_through_the_beam_bookkeeping_with_one_row() -> None:
    h = Harness()
    h.add("beam1", 12, beam_size=1)
    out = h.step()
    assert out.encode[0].slots == (0,) and h.scheduler.requests["beam1"].is_beam
    h.drain()
    assert h.finished["beam1"].token_ids == list(beam_tokens("beam1", 12))
    h.assert_all_returned()


def test_a_beam_request_waits_until_all_its_rows_are_free_and_nothing_overtakes_it() -> None:
    h = Harness(max_num_seqs=4, starvation_bound=10_000)
    for i in range(3):
        h.add(f"g{i}", 20)
    h.step()
    h.add("beam", 5, beam_size=3)
    h.add("late", 5)
    while "beam" not in {row.request_id for row in h.step().encode}:
        # One row is free, not three: the beam waits, and the greedy request behind it waits too.
        assert "late" not in h.finished and h.scheduler.waiting[0].request_id == "beam"
    h.drain()
    assert set(h.finished) == {"g0", "g1", "g2", "beam", "late"}
    h.assert_all_returned()


def test_a_tick_is_shortened_so_no_search_runs_past_its_budget() -> None:
    h = Harness(decode_steps_per_tick=4)
    h.add("beam", 400, beam_size=2, max_new_tokens=10)  # would never choose end-of-text by itself
    h.add("greedy", 30)
    steps = []
    while h.scheduler.has_work:
        out = h.step()
        if out.decode:
            steps.append(out.num_decode_steps)
    beam = h.finished["beam"]
    assert beam.finish_reason is FinishReason.LENGTH and beam.token_ids == list(beam_tokens("beam", 10))
    assert steps[:4] == [4, 4, 1, 4]  # 1 (encode) + 4 + 4 + 1 = 10, then full ticks again
    assert h.finished["greedy"].token_ids == [1000 + i for i in range(30)]  # greedy rows lose nothing
    h.assert_all_returned()


def test_the_tick_before_a_budget_is_cut_to_end_exactly_there() -> None:
    h = Harness(decode_steps_per_tick=4, combined_decode_steps=1)
    h.add("beam", 400, beam_size=2, max_new_tokens=7)
    h.step()  # encode: 1 token
    assert [h.step().num_decode_steps for _ in range(2)] == [4, 2]  # 1 + 4 + 2 = 7
    assert h.finished["beam"].finish_reason is FinishReason.LENGTH
    h.assert_all_returned()


def test_abort_frees_every_row_of_a_waiting_in_flight_or_running_beam_request() -> None:
    h = Harness()
    h.add("a", 50, beam_size=3)
    h.add("b", 50, beam_size=2)
    out = h.scheduler.schedule()  # a and b are being encoded
    h.add("c", 50, beam_size=4)
    assert h.scheduler.abort("c").finish_reason is FinishReason.ABORTED  # waiting
    assert h.scheduler.abort("a").finished  # in flight: its results must be ignored
    assert h.scheduler.update(out, h.runner.execute(out)) == []  # b's search goes on: no partial output
    assert h.scheduler.pool.num_used == 2 and len(h.scheduler._free_slots) == 6
    h.step()
    b_slots = list(h.scheduler.requests["b"].slots)
    assert h.scheduler.abort("b").finish_reason is FinishReason.ABORTED  # running
    assert not h.scheduler.has_work
    h.assert_all_returned()
    assert sorted(h.scheduler.schedule().released_slots) == sorted(b_slots)  # the runner hears of every row


def test_a_runner_that_does_not_end_a_search_at_its_budget_is_an_error() -> None:
    h = Harness()
    h.add("beam", 400, beam_size=2, max_new_tokens=3)
    out = h.scheduler.schedule()
    h.scheduler.update(out, RunnerOutput(encoded={"beam": EncodeResult((), "en")}))
    out = h.scheduler.schedule()
    assert out.num_decode_steps == 2
    with pytest.raises(RuntimeError, match="did not end a beam search"):
        h.scheduler.update(out, RunnerOutput())


def test_requests_that_could_never_fit_are_refused_when_added() -> None:
    h = Harness(num_blocks=1 + 2 * 28)  # two full-length rows
    with pytest.raises(ValueError, match="decode rows"):
        h.add("wide", 5, beam_size=9)
    with pytest.raises(ValueError, match="KV blocks"):
        h.add("deep", 5, beam_size=3)
    h.add("fits", 5, beam_size=2)
    h.drain()
    assert h.finished["fits"].token_ids == list(beam_tokens("fits", 5))


def test_no_row_is_lost_with_beams_greedy_requests_aborts_and_preemption() -> None:
    rng = random.Random(11)
    h = Harness(num_blocks=1 + 4 * 28 + 10, max_num_seqs=12, starvation_bound=4)
    ids = [f"r{i}" for i in range(160)]
    beam_sizes = {i: rng.choice((None, None, 1, 2, 3, 4)) for i in ids}
    budgets = {i: rng.choice((400, 400, 400, rng.randint(1, 40))) for i in ids}
    added, aborted = 0, set()
    preempted_beams = 0
    while h.scheduler.has_work or added < len(ids):
        for request_id in ids[added : added + rng.randint(0, 4)]:
            h.add(request_id, rng.randint(0, 90), beam_sizes[request_id], max_new_tokens=budgets[request_id])
            added += 1
        if rng.random() < 0.04 and h.scheduler.requests:
            victim = rng.choice(sorted(h.scheduler.requests))
            h.finished[victim] = h.scheduler.abort(victim)
            aborted.add(victim)
        out = h.step()
        preempted_beams += sum(h.requests[r].is_beam for r in out.preempted)
    assert set(h.finished) == set(ids)
    for request_id, output in h.finished.items():
        length, budget = h.lengths[request_id], budgets[request_id]
        if request_id in aborted:
            assert output.finish_reason is FinishReason.ABORTED
        elif beam_sizes[request_id] is None:
            assert output.token_ids == [1000 + i for i in range(min(length, budget))], request_id
        else:
            assert output.token_ids == list(beam_tokens(request_id, min(length, budget))), request_id
            assert output.finish_reason is (FinishReason.END_OF_TEXT if length < budget else FinishReason.LENGTH)
    assert preempted_beams > 0  # the small pool did make beam requests yield and recompute
    h.assert_all_returned()
