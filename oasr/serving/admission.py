"""Who gets served: caps on the requests one client and one API key have open, and on those admitted at once.

A request passes two gates. When its headers arrive, before its body is read, it takes a place among its
client's (peer address) and its API key's open requests (``ClientCaps``): one client cannot hold more than its
cap, uploading or decoding. Once its upload is complete it takes a place among the requests being served
(``Admission``, ``max_in_flight``), so a client that trickles its body holds no place anyone else could use.
Both refuse at once with 429 and Retry-After instead of queueing without bound. Used on the event loop only.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from oasr.serving.protocol import APIError


class Ticket:
    """One request's place; ``release`` is idempotent, so every way out may call it."""

    def __init__(self, on_release: Callable[[], None]) -> None:
        self._on_release = on_release
        self._released = False
        self.admitted_at = time.perf_counter()

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._on_release()


def busy(message: str, retry_after_s: int, code: str = "server_busy") -> APIError:
    return APIError(429, message, type="rate_limit_error", code=code, headers={"Retry-After": str(retry_after_s)})


class Admission:
    """Transcription requests being served (queued or decoding). Past ``limit`` new ones are refused."""

    def __init__(self, limit: int, retry_after_s: int,
                 on_change: Callable[[int], None] = lambda num_in_flight: None) -> None:
        self.limit = limit
        self.retry_after_s = retry_after_s
        self.num_in_flight = 0
        self.on_change = on_change  # told the new count after every change (the metrics of several workers)

    def acquire(self, hold: Ticket | None = None) -> Ticket:
        """A place; releasing it releases ``hold`` too (the request's place among its client's)."""
        if self.num_in_flight >= self.limit:
            raise busy(f"The server is serving its maximum of {self.limit} requests; retry shortly.",
                       self.retry_after_s)
        self.num_in_flight += 1
        self.on_change(self.num_in_flight)

        def release() -> None:
            self.num_in_flight -= 1
            self.on_change(self.num_in_flight)
            if hold is not None:
                hold.release()

        return Ticket(release)


class OpenCounts:
    """Open requests per name (a peer address, an API key's index), at most ``limit`` each. Names leave the
    table when their count drops to zero, so it holds only clients with requests open."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.counts: dict[object, int] = {}

    def full(self, name: object) -> bool:
        return self.limit is not None and self.counts.get(name, 0) >= self.limit

    def add(self, name: object) -> None:
        self.counts[name] = self.counts.get(name, 0) + 1

    def remove(self, name: object) -> None:
        if self.counts[name] == 1:
            del self.counts[name]
        else:
            self.counts[name] -= 1


class ClientCaps:
    """The requests each client (peer address) and each API key has open, from headers to answer."""

    def __init__(self, per_client: int | None, per_key: int | None, retry_after_s: int) -> None:
        self.clients = OpenCounts(per_client)
        self.keys = OpenCounts(per_key)
        self.retry_after_s = retry_after_s

    def acquire(self, client: str, key: int | None) -> Ticket:
        """``key``: the index of the API key the request authenticated with (None on an open server)."""
        if self.clients.full(client):
            raise busy(f"This client already has {self.clients.limit} requests open, the most one client may; "
                       "retry once one has been answered.", self.retry_after_s, code="client_busy")
        if key is not None and self.keys.full(key):
            raise busy(f"This API key already has {self.keys.limit} requests open, the most one key may; "
                       "retry once one has been answered.", self.retry_after_s, code="client_busy")
        self.clients.add(client)
        if key is not None:
            self.keys.add(key)

        def release() -> None:
            self.clients.remove(client)
            if key is not None:
                self.keys.remove(key)

        return Ticket(release)
