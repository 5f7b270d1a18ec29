"""A streaming runtime's per-step forward as CUDA graphs, one per shape key (lookahead, batch bucket, ...).

A chunk of one stream is a few encoder frames, so a step's forward is a thousand small kernels whose launches,
not their arithmetic, set a lone stream's latency. The forward of a step has one shape per key, reads its inputs
and the state pool in place and writes the pool in place, so it can be captured once and replayed.

Capturing runs the function once eagerly first (lazy initialisation, library plans) on ``scratch`` inputs, whose
slots point at a slot no stream owns: the capture's own warm-up must not advance any stream's state. All keys
share one memory pool, since their graphs never run at the same time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


class StepGraphs:
    def __init__(self) -> None:
        self._graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, dict[str, torch.Tensor], Any]] = {}
        self._pool: Any = None

    def __len__(self) -> int:
        return len(self._graphs)

    def run(self, key: tuple, forward: Callable[..., Any], inputs: dict[str, torch.Tensor],
            scratch: dict[str, torch.Tensor]) -> Any:
        """``forward(**inputs)`` through the graph of ``key`` (captured from ``scratch`` on first use). The outputs
        are the graph's own tensors: valid until the next ``run`` of the same key."""
        entry = self._graphs.get(key)
        if entry is None:
            entry = self._graphs[key] = self._capture(forward, scratch)
        graph, static, outputs = entry
        for name, value in inputs.items():
            static[name].copy_(value)
        graph.replay()
        return outputs

    def _capture(self, forward: Callable[..., Any], scratch: dict[str, torch.Tensor]):
        static = {name: value.clone() for name, value in scratch.items()}
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            forward(**static)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            outputs = forward(**static)
        self._pool = graph.pool()
        return graph, static, outputs
