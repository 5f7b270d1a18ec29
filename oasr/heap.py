"""Keeps the C heap from holding on to freed request buffers.

A server's requests bring buffers of 0.1-100 MB: upload bodies, decoded samples, features. glibc gives a buffer
above its mmap threshold a mapping of its own and unmaps it when it is freed, but each such free raises the
threshold to that buffer's size (up to 32 MiB). From then on buffers of that size come from the heap, whose freed
middle cannot go back to the system, so a long-running process's resident memory climbs to the worst mix of
sizes it has seen and stays there. A fixed threshold keeps every large buffer in its own mapping, and a cap on
malloc's per-thread arenas keeps threads from each holding a heap of their own.

Small allocations still fragment the heap: freed pages between live objects stay resident until glibc is asked
to give them back. ``HeapTrimmer`` asks (``malloc_trim``), at most once per interval, from a loop that runs
anyway (the engine core's).

``bound_heap`` is called first thing in every long-running process (the server, its API workers, the engine
core). Both are no-ops where the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import sys
import time

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8  # glibc's mallopt parameters (malloc.h)
MMAP_THRESHOLD = 256 << 10  # buffers of 256 KiB (4 s of 16 kHz samples) and more get their own mapping
TRIM_THRESHOLD = 4 << 20  # free memory at the heap's top beyond this goes back to the system
ARENA_MAX = 2


def _glibc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None  # musl lacks them


def bound_heap() -> bool:
    """Fixes glibc's mmap threshold and caps its arenas; True where it could (Linux with glibc)."""
    libc = _glibc()
    if libc is None:
        return False
    settings = ((_M_MMAP_THRESHOLD, MMAP_THRESHOLD), (_M_TRIM_THRESHOLD, TRIM_THRESHOLD), (_M_ARENA_MAX, ARENA_MAX))
    return all(libc.mallopt(parameter, value) == 1 for parameter, value in settings)


class HeapTrimmer:
    """``maybe_trim()`` hands the heap's free pages back to the system, at most once per ``interval_s``."""

    def __init__(self, interval_s: float = 1.0) -> None:
        self.interval_s = interval_s
        self._libc = _glibc()
        self._next = 0.0

    def maybe_trim(self) -> bool:
        """True when it trimmed (a few milliseconds for a heap of hundreds of MB)."""
        now = time.monotonic()
        if self._libc is None or now < self._next:
            return False
        self._next = now + self.interval_s
        self._libc.malloc_trim(0)
        return True
