"""Request priority in the bare scheduler, with fabricated runner outputs: live turns go ahead of bulk work,
take the place of the newest bulk request when every slot is held, and never displace one another."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from oasr.engine.block_pool import BlockPool
from oasr.engine.config import SchedulerConfig
from oasr.engine.request import INTERACTIVE_PRIORITY, Request
from oasr.engine.scheduler import Scheduler
from oasr.engine.step import SchedulerOutput
from test_scheduler import EOT, MAX_POSITIONS, FakeRunner, assert_rows_distinct, make_request, make_scheduler


def interactive(request_id: str) -> Request:
    return replace(make_request(request_id), priority=INTERACTIVE_PRIORITY)


def step(scheduler: Scheduler, runner: FakeRunner) -> SchedulerOutput:
    out = scheduler.schedule()
    assert_rows_distinct(out)
    scheduler.update(out, runner.execute(out))
    return out


def encoded(out: SchedulerOutput) -> list[str]:
    return [row.request_id for row in out.encode]


def drain(scheduler: Scheduler, runner: FakeRunner, lengths: dict[str, int], *, never_preempted=()) -> None:
    """Runs every request to its end: each produced its whole output, and none in ``never_preempted`` yielded."""
    finished = {}
    for _ in range(10_000):
        if not scheduler.has_work:
            break
        out = step_and_collect(scheduler, runner, finished)
        assert not set(out.preempted) & set(never_preempted), out.preempted
    assert {r: finished[r].token_ids for r in lengths} == {r: [1000 + i for i in range(n)] for r, n in lengths.items()}


def step_and_collect(scheduler: Scheduler, runner: FakeRunner, finished: dict) -> SchedulerOutput:
    out = scheduler.schedule()
    assert_rows_distinct(out)
    for output in scheduler.update(out, runner.execute(out)):
        if output.finished:
            finished[output.request_id] = output
    return out


def test_an_interactive_request_is_encoded_ahead_of_a_queue_of_bulk_requests() -> None:
    scheduler = make_scheduler(max_encode_rows=2)
    for i in range(4):
        scheduler.add(make_request(f"bulk{i}"))
    scheduler.add(interactive("turn"))
    assert encoded(scheduler.schedule()) == ["turn", "bulk0"]


def test_an_interactive_arrival_does_not_wait_for_a_worthwhile_combined_walk() -> None:
    # Six bulk requests decode in eight slots; the four waiting behind them are held back until a combined walk
    # is worth its fixed cost (four rows), which two free slots never give.
    scheduler = make_scheduler(max_num_seqs=8, max_encode_rows=6, max_combined_encode_rows=4,
                               min_combined_encode_rows=4, max_encode_delay=1000, starvation_bound=1000)
    lengths = {**{f"bulk{i}": 400 for i in range(10)}, "turn": 5}
    runner = FakeRunner(lengths)
    for i in range(6):
        scheduler.add(make_request(f"bulk{i}"))
    assert len(step(scheduler, runner).encode) == 6
    for i in range(6, 10):
        scheduler.add(make_request(f"bulk{i}"))
    for _ in range(3):
        assert not step(scheduler, runner).encode
    scheduler.add(interactive("turn"))
    out = step(scheduler, runner)
    assert encoded(out) == ["turn", "bulk6"] and not out.preempted  # the turn first; a bulk row rides along


def test_with_every_slot_held_by_bulk_an_interactive_arrival_preempts_the_newest_bulk_request() -> None:
    scheduler = make_scheduler(max_num_seqs=4, starvation_bound=1000)
    lengths = {**{f"bulk{i}": 60 for i in range(6)}, "turn": 5}
    runner = FakeRunner(lengths)
    for i in range(4):
        scheduler.add(make_request(f"bulk{i}"))
    step(scheduler, runner)
    for i in range(4, 6):  # more bulk waiting: they do not preempt anyone
        scheduler.add(make_request(f"bulk{i}"))
    for _ in range(2):
        assert not step(scheduler, runner).preempted
    scheduler.add(interactive("turn"))
    out = step(scheduler, runner)
    assert out.preempted == ("bulk3",) and encoded(out) == ["turn"]
    assert [r.request_id for r in scheduler.running] == ["bulk0", "bulk1", "bulk2", "turn"]
    drain(scheduler, runner, lengths, never_preempted={"turn"})


def test_an_interactive_arrival_preempts_bulk_rather_than_a_newer_interactive_request() -> None:
    scheduler = make_scheduler(max_num_seqs=3, starvation_bound=1000)
    lengths = {"bulk0": 60, "bulk1": 60, "turn0": 60, "turn1": 5}
    runner = FakeRunner(lengths)
    scheduler.add(make_request("bulk0"))
    scheduler.add(make_request("bulk1"))
    step(scheduler, runner)
    scheduler.add(interactive("turn0"))
    step(scheduler, runner)  # a free slot: admitted without preempting
    assert [r.request_id for r in scheduler.running] == ["bulk0", "bulk1", "turn0"]
    scheduler.add(interactive("turn1"))
    out = step(scheduler, runner)
    assert out.preempted == ("bulk1",) and encoded(out) == ["turn1"]
    drain(scheduler, runner, lengths, never_preempted={"turn0", "turn1"})


def test_an_interactive_request_never_preempts_another_interactive_one() -> None:
    scheduler = make_scheduler(max_num_seqs=2, starvation_bound=1000)
    lengths = {"turn0": 40, "turn1": 40, "turn2": 5}
    runner = FakeRunner(lengths)
    scheduler.add(interactive("turn0"))
    scheduler.add(interactive("turn1"))
    step(scheduler, runner)
    scheduler.add(interactive("turn2"))
    waited = 0
    while "turn2" not in encoded(out := step(scheduler, runner)):
        assert not out.preempted
        waited += 1
    assert waited > 5  # it waited for a slot to free, as any request of equal priority does
    drain(scheduler, runner, {"turn2": 5})


def test_a_starving_bulk_request_does_not_preempt_an_interactive_one() -> None:
    scheduler = make_scheduler(max_num_seqs=2, starvation_bound=3)
    lengths = {"turn0": 60, "turn1": 60, "bulk": 5}
    runner = FakeRunner(lengths)
    scheduler.add(interactive("turn0"))
    scheduler.add(interactive("turn1"))
    step(scheduler, runner)
    scheduler.add(make_request("bulk"))
    drain(scheduler, runner, lengths, never_preempted={"turn0", "turn1"})


def test_decode_block_shortage_preempts_the_newest_bulk_request_before_a_newer_interactive_one() -> None:
    # Room for three requests' first block and two more: the two bulk requests, a step ahead, take the two
    # when their decode reaches a second block; the turn reaches its own a step later and finds none.
    config = SchedulerConfig(max_num_seqs=4, max_encode_rows=4, max_combined_encode_rows=2,
                             decode_steps_per_tick=4, combined_decode_steps=4, starvation_bound=1000)
    scheduler = Scheduler(config, BlockPool(1 + 3 + 2, 16), eot=EOT, max_positions=MAX_POSITIONS)
    lengths = {"bulk0": 30, "bulk1": 30, "turn": 30}
    runner = FakeRunner(lengths)
    scheduler.add(make_request("bulk0"))
    scheduler.add(make_request("bulk1"))
    step(scheduler, runner)
    scheduler.add(interactive("turn"))
    step(scheduler, runner)
    assert [r.request_id for r in scheduler.running] == ["bulk0", "bulk1", "turn"]
    preempted = []
    while not preempted:
        preempted = list(step(scheduler, runner).preempted)
    assert preempted == ["bulk1"]
    drain(scheduler, runner, lengths, never_preempted={"turn"})


def test_within_one_priority_the_batching_policys_order_stays() -> None:
    scheduler = make_scheduler(max_encode_rows=8, policy="shortest_audio_first")
    sizes = {"bulk-long": 900, "turn-long": 800, "bulk-short": 100, "turn-short": 200, "bulk-mid": 500}
    for request_id, size in sizes.items():
        request = replace(make_request(request_id), audio=np.zeros(size, dtype=np.float32))
        scheduler.add(replace(request, priority=INTERACTIVE_PRIORITY) if request_id.startswith("turn") else request)
    assert encoded(scheduler.schedule()) == ["turn-short", "turn-long", "bulk-short", "bulk-mid", "bulk-long"]


def test_requests_of_one_priority_are_scheduled_as_without_priorities() -> None:
    """The same load, all bulk and all interactive, gives the same steps: a shared priority changes nothing."""
    def steps(priority: int) -> list[tuple]:
        scheduler = make_scheduler(num_blocks=60, max_num_seqs=6, starvation_bound=4)
        lengths = {f"r{i}": 20 + 13 * i % 70 for i in range(14)}
        runner = FakeRunner(lengths)
        trace = []
        for i, request_id in enumerate(lengths):
            scheduler.add(replace(make_request(request_id), priority=priority))
            if i % 3 == 2:
                out = step(scheduler, runner)
                trace.append((encoded(out), out.preempted, out.num_decode_steps))
        while scheduler.has_work:
            out = step(scheduler, runner)
            trace.append((encoded(out), out.preempted, out.num_decode_steps))
        return trace

    bulk = steps(0)
    assert any(preempted for _, preempted, _ in bulk)  # the load does reach the starvation bound
    assert steps(INTERACTIVE_PRIORITY) == bulk
