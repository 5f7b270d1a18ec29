"""How many rows each engine step carried, per walk (encode, decode): counts by size bucket, as a Prometheus
histogram wants them. The engine owns a ``BatchSizeCounter``; ``EngineStats`` carries frozen snapshots."""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from oasr.engine.config import DEFAULT_BATCH_BUCKETS


@dataclass(frozen=True)
class BatchSizeCounts:
    """Steps whose walk carried at most ``bounds[i]`` rows, for each i (cumulative, like ``le`` buckets), every
    such step (``num_steps``, the ``+Inf`` bucket) and the rows over all of them (``num_rows``)."""

    bounds: tuple[int, ...] = DEFAULT_BATCH_BUCKETS
    cumulative: tuple[int, ...] = (0,) * len(DEFAULT_BATCH_BUCKETS)
    num_steps: int = 0
    num_rows: int = 0

    def __add__(self, other: BatchSizeCounts) -> BatchSizeCounts:
        """Both engines' steps together (engines of one configuration, so the same bounds)."""
        if other.bounds != self.bounds:
            raise ValueError(f"cannot add batch-size counts over bounds {self.bounds} and {other.bounds}")
        return BatchSizeCounts(self.bounds, tuple(a + b for a, b in zip(self.cumulative, other.cumulative)),
                               self.num_steps + other.num_steps, self.num_rows + other.num_rows)


class BatchSizeCounter:
    """Counts steps by batch size. Steps without a walk of this kind (size 0) are not counted."""

    def __init__(self, bounds: tuple[int, ...] = DEFAULT_BATCH_BUCKETS) -> None:
        self.bounds = tuple(bounds)
        self._per_bucket = [0] * (len(self.bounds) + 1)  # the last one: larger than every bound
        self._num_rows = 0

    def observe(self, num_rows: int) -> None:
        if num_rows > 0:
            self._per_bucket[bisect.bisect_left(self.bounds, num_rows)] += 1
            self._num_rows += num_rows

    def snapshot(self) -> BatchSizeCounts:
        cumulative, running = [], 0
        for count in self._per_bucket[:-1]:
            running += count
            cumulative.append(running)
        return BatchSizeCounts(self.bounds, tuple(cumulative), running + self._per_bucket[-1], self._num_rows)
