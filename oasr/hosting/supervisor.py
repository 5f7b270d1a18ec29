"""When a dead engine core is started again, and how long to wait first.

A core dies of a CUDA fault, the OOM killer or a bug; the server outlives it. Each death starts a new core after a
delay that doubles from ``first_delay_s`` up to ``max_delay_s``, so a model that kills its process each time it
loads is not loaded in a tight loop; after ``max_restarts`` deaths in a row the server gives up and stays
unhealthy. A core that served ``stable_s`` seconds resets the count: deaths far apart are not "in a row".
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True)
class RestartPolicy:
    max_restarts: int = 8  # deaths in a row after which the core stays down (0: never restart)
    first_delay_s: float = 0.5
    max_delay_s: float = 30.0
    stable_s: float = 300.0

    def __post_init__(self) -> None:
        if self.max_restarts < 0 or self.first_delay_s < 0 or self.max_delay_s < self.first_delay_s:
            raise ValueError(f"invalid restart policy {self}")


class RestartBudget:
    """Counts a core's deaths under a ``RestartPolicy``; not thread-safe (one supervising thread owns it)."""

    def __init__(self, policy: RestartPolicy) -> None:
        self.policy = policy
        self._in_a_row = 0
        self._started_at = time.monotonic()

    def died(self) -> float | None:
        """A core died: the seconds to wait before starting the next, or None when no restart is left."""
        if time.monotonic() - self._started_at >= self.policy.stable_s:
            self._in_a_row = 0
        if self._in_a_row >= self.policy.max_restarts:
            return None
        delay = min(self.policy.first_delay_s * 2 ** self._in_a_row, self.policy.max_delay_s)
        self._in_a_row += 1
        return delay

    def started(self) -> None:
        """A new core is up and serving."""
        self._started_at = time.monotonic()
