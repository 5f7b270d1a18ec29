"""The scheduler on CPU with fabricated runner outputs: caps, starvation bound, memory, abort, no lost rows."""

from __future__ import annotations

import random

import numpy as np
import pytest

from oasr.engine.block_pool import BlockPool
from oasr.engine.config import SchedulerConfig
from oasr.engine.request import FinishReason, Request
from oasr.engine.scheduler import Scheduler
from oasr.engine.step import EncodeResult, RunnerOutput, SchedulerOutput
from oasr.types import DecodeOptions

EOT = 0
PROMPT = 4
MAX_POSITIONS = 448


def make_request(request_id: str, *, max_new_tokens: int = 400) -> Request:
    return Request(
        request_id=request_id,
        audio=np.zeros(160, dtype=np.float32),
        options=DecodeOptions(),
        prompt_len=PROMPT,
        num_frames=3000,
        max_new_tokens=max_new_tokens,
    )


def token(request_id: str, index: int, lengths: dict[str, int]) -> int:
    """A deterministic stream per request: ``lengths[id]`` tokens, then end-of-text."""
    return EOT if index >= lengths[request_id] else 1000 + index


class FakeRunner:
    """Stands in for the model: answers a step like the real runner would, from request ids alone."""

    def __init__(self, lengths: dict[str, int]) -> None:
        self.lengths = lengths
        self.produced: dict[str, int] = {}

    def execute(self, out: SchedulerOutput) -> RunnerOutput:
        encoded, decoded = {}, {}
        for row in out.encode:
            self.produced[row.request_id] = 1
            encoded[row.request_id] = EncodeResult((token(row.request_id, 0, self.lengths),), "en")
        for row in out.decode:
            start = self.produced[row.request_id]
            decoded[row.request_id] = tuple(
                token(row.request_id, start + i, self.lengths) for i in range(out.num_decode_steps)
            )
            self.produced[row.request_id] = start + out.num_decode_steps
        return RunnerOutput(encoded=encoded, decoded=decoded)


def make_scheduler(num_blocks: int = 1000, **overrides) -> Scheduler:
    config = SchedulerConfig(**{"max_num_seqs": 8, "max_encode_rows": 4, "max_combined_encode_rows": 2, **overrides})
    return Scheduler(config, BlockPool(num_blocks, 16), eot=EOT, max_positions=MAX_POSITIONS)


def assert_rows_distinct(out: SchedulerOutput) -> None:
    """No slot or KV block is handed to two rows of one step."""
    rows = (*out.encode, *out.decode)
    slots = [slot for row in rows for slot in row.slots]
    blocks = [block for row in rows for table in row.block_ids for block in table]
    assert len(set(slots)) == len(slots) and len(set(blocks)) == len(blocks)
    assert all(len(row.block_ids) == len(row.slots) for row in rows)


def run_to_completion(scheduler: Scheduler, runner: FakeRunner, *, max_steps: int = 10_000, check=None):
    finished = {}
    for _ in range(max_steps):
        if not scheduler.has_work:
            return finished
        out = scheduler.schedule()
        if check:
            check(scheduler, out)
        for output in scheduler.update(out, runner.execute(out)):
            if output.finished:
                assert output.request_id not in finished, "a request finished twice"
                finished[output.request_id] = output
    raise AssertionError("scheduler did not drain")


def test_encode_walk_respects_its_caps_alone_and_beside_decode_rows() -> None:
    scheduler = make_scheduler()
    runner = FakeRunner({f"r{i}": 50 for i in range(10)})
    for i in range(10):
        scheduler.add(make_request(f"r{i}"))
    first = scheduler.schedule()
    assert [r.request_id for r in first.encode] == ["r0", "r1", "r2", "r3"] and not first.decode
    scheduler.update(first, runner.execute(first))
    second = scheduler.schedule()
    assert len(second.decode) == 4
    assert [r.request_id for r in second.encode] == ["r4", "r5"]  # the combined cap
    assert second.num_decode_steps == scheduler.config.combined_decode_steps


def test_pure_decode_steps_run_a_full_tick() -> None:
    scheduler = make_scheduler(decode_steps_per_tick=6)
    runner = FakeRunner({"a": 50})
    scheduler.add(make_request("a"))
    out = scheduler.schedule()
    scheduler.update(out, runner.execute(out))
    out = scheduler.schedule()
    assert out.num_decode_steps == 6 and not out.encode


def test_encoder_frame_cap_limits_a_step() -> None:
    scheduler = make_scheduler(max_encoder_frames=2 * 3000)
    for i in range(4):
        scheduler.add(make_request(f"r{i}"))
    assert len(scheduler.schedule().encode) == 2


def test_no_request_is_lost_under_random_load_aborts_and_small_memory() -> None:
    rng = random.Random(7)
    lengths = {f"r{i}": rng.randint(0, 120) for i in range(300)}
    scheduler = make_scheduler(num_blocks=60, max_num_seqs=16, starvation_bound=5)
    runner = FakeRunner(lengths)
    aborted: set[str] = set()
    ids = list(lengths)
    for request_id in ids[:100]:
        scheduler.add(make_request(request_id))
    added = 100
    finished = {}
    peak_blocks = 0
    while scheduler.has_work or added < len(ids):
        arriving = ids[added : added + rng.randint(0, 6)]
        for request_id in arriving:
            scheduler.add(make_request(request_id))
        added += len(arriving)
        if rng.random() < 0.05 and scheduler.requests:
            victim = rng.choice(sorted(scheduler.requests))
            output = scheduler.abort(victim)
            aborted.add(victim)
            finished[victim] = output
        out = scheduler.schedule()
        peak_blocks = max(peak_blocks, scheduler.pool.num_used)
        assert_rows_distinct(out)
        for output in scheduler.update(out, runner.execute(out)):
            if output.finished:
                assert output.request_id not in finished
                finished[output.request_id] = output
    assert set(finished) == set(ids[:added])
    for request_id, output in finished.items():
        if request_id in aborted:
            assert output.finish_reason is FinishReason.ABORTED
        else:
            assert output.token_ids == [1000 + i for i in range(lengths[request_id])], request_id
    assert peak_blocks <= 59
    assert scheduler.pool.num_used == 0 and sorted(scheduler._free_slots) == list(range(16))


def test_a_newcomer_is_encoded_within_the_starvation_bound_when_decode_rows_fill_every_slot() -> None:
    bound = 5
    scheduler = make_scheduler(max_num_seqs=2, starvation_bound=bound)
    lengths = {"long-a": 400, "long-b": 400, "newcomer": 3}
    runner = FakeRunner(lengths)
    scheduler.add(make_request("long-a"))
    scheduler.add(make_request("long-b"))
    for _ in range(3):
        out = scheduler.schedule()
        scheduler.update(out, runner.execute(out))
    scheduler.add(make_request("newcomer"))
    arrival = scheduler.step_count
    first_token_step = None
    finished = {}
    while scheduler.has_work:
        out = scheduler.schedule()
        if any(r.request_id == "newcomer" for r in out.encode) and first_token_step is None:
            first_token_step = out.step
        for output in scheduler.update(out, runner.execute(out)):
            if output.finished:
                finished[output.request_id] = output
    assert first_token_step is not None and first_token_step - arrival <= bound + 1
    # The request that yielded its slot was recomputed and still produced its whole, identical output.
    assert all(finished[r].token_ids == [1000 + i for i in range(lengths[r])] for r in lengths)


def test_requests_wait_when_blocks_run_out_and_memory_never_exceeds_the_pool() -> None:
    blocks = 1 + 28 + 4  # the null block, one full sequence, a little more
    scheduler = make_scheduler(num_blocks=blocks, max_num_seqs=8, starvation_bound=10_000)
    lengths = {f"r{i}": 200 for i in range(6)}
    runner = FakeRunner(lengths)
    for request_id in lengths:
        scheduler.add(make_request(request_id))

    def check(s: Scheduler, out: SchedulerOutput) -> None:
        assert s.pool.num_used <= blocks - 1
        held = sum(len(blocks) for r in s.running for blocks in r.block_ids)
        assert held == s.pool.num_used

    finished = run_to_completion(scheduler, runner, check=check)
    assert all(finished[r].token_ids == [1000 + i for i in range(200)] for r in lengths)


def test_abort_waiting_running_and_in_flight_requests() -> None:
    scheduler = make_scheduler()
    runner = FakeRunner({"a": 50, "b": 50, "c": 50})
    for request_id in ("a", "b"):
        scheduler.add(make_request(request_id))
    out = scheduler.schedule()  # a and b are being encoded
    scheduler.add(make_request("c"))
    assert scheduler.abort("c").finish_reason is FinishReason.ABORTED  # waiting
    assert scheduler.abort("a").finished  # in flight: its results must be ignored
    updates = scheduler.update(out, runner.execute(out))
    assert [u.request_id for u in updates] == ["b"]
    assert scheduler.abort("b").finish_reason is FinishReason.ABORTED  # running
    assert scheduler.abort("b") is None  # already gone
    assert not scheduler.has_work and scheduler.pool.num_used == 0
    assert scheduler.schedule().released_slots  # the runner hears about the freed slots


def test_length_limit_finishes_a_request() -> None:
    scheduler = make_scheduler()
    runner = FakeRunner({"a": 400})
    scheduler.add(make_request("a", max_new_tokens=10))
    finished = run_to_completion(scheduler, runner)
    assert finished["a"].finish_reason is FinishReason.LENGTH and len(finished["a"].token_ids) == 10


def test_duplicate_request_ids_are_refused() -> None:
    scheduler = make_scheduler()
    scheduler.add(make_request("a"))
    with pytest.raises(ValueError, match="already in use"):
        scheduler.add(make_request("a"))


def test_scheduler_module_imports_no_torch() -> None:
    import ast
    from pathlib import Path

    import oasr.engine.scheduler as module

    for dependency in ("scheduler", "block_pool", "policies", "request", "config"):
        source = Path(module.__file__).with_name(f"{dependency}.py").read_text()
        imported = {
            alias.name.split(".")[0]
            for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.Import, ast.ImportFrom))
            for alias in (node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")])
        }
        assert "torch" not in imported, dependency


def test_beside_decode_rows_small_encode_walks_wait_until_worth_it_but_not_past_the_delay() -> None:
    scheduler = make_scheduler(max_num_seqs=4, max_combined_encode_rows=4, min_combined_encode_rows=2,
                               max_encode_delay=3)
    lengths = {"a": 400, "b": 400, "c": 400, "short": 2, "late": 5, "later": 5}
    runner = FakeRunner(lengths)
    for request_id in ("a", "b", "c", "short"):
        scheduler.add(make_request(request_id))
    out = scheduler.schedule()
    scheduler.update(out, runner.execute(out))
    for _ in range(3):  # "short" finishes and frees one slot
        out = scheduler.schedule()
        scheduler.update(out, runner.execute(out))
    assert len(scheduler.running) == 3
    scheduler.add(make_request("late"))
    scheduler.add(make_request("later"))
    waited = 0
    while True:
        out = scheduler.schedule()
        if out.encode:
            break
        assert out.num_decode_steps == scheduler.config.decode_steps_per_tick
        waited += 1
        scheduler.update(out, runner.execute(out))
    # One free slot for two waiting rows is less than a worthwhile walk: the head waits, but only
    # max_encode_delay steps.
    assert [r.request_id for r in out.encode] == ["late"] and waited == 3
