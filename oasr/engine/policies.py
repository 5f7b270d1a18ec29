"""Batching policies: the order in which waiting requests are considered for the encode walk."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from oasr.engine.request import Request
from oasr.registry import Registry

Policy = Callable[[Iterable[Request]], list[Request]]

BATCHING_POLICIES: Registry[Policy] = Registry("batching policy")


@BATCHING_POLICIES.register("fifo")
def fifo(waiting: Iterable[Request]) -> list[Request]:
    """Arrival order; a preempted request keeps its original place."""
    return sorted(waiting, key=lambda r: r.arrival_step)


@BATCHING_POLICIES.register("shortest_audio_first")
def shortest_audio_first(waiting: Iterable[Request]) -> list[Request]:
    """Short inputs first (lower mean latency under load); ties by arrival. The starvation bound still applies."""
    return sorted(waiting, key=lambda r: (len(r.audio), r.arrival_step))
