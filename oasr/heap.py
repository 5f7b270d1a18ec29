"""Keeps the C heap from holding on to freed request buffers.

A server's requests bring buffers of 0.1-100 MB: upload bodies, decoded samples, features. glibc gives a buffer
above its mmap threshold a mapping of its own and unmaps it when it is freed, but each such free raises the
threshold to that buffer's size (up to 32 MiB). From then on buffers of that size come from the heap, whose freed
middle cannot go back to the system, so a long-running process's resident memory climbs to the worst mix of
sizes it has seen and stays there. A fixed threshold keeps every large buffer in its own mapping, and a cap on
malloc's per-thread arenas keeps threads from each holding a heap of their own.

``bound_heap`` is called first thing in every long-running process (the server, its API workers, the engine
core). It is a no-op where the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import sys

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8  # glibc's mallopt parameters (malloc.h)
MMAP_THRESHOLD = 1 << 20  # buffers of 1 MiB and more get their own mapping, returned when freed
TRIM_THRESHOLD = 4 << 20  # free memory at the heap's top beyond this goes back to the system
ARENA_MAX = 2


def bound_heap() -> bool:
    """Fixes glibc's mmap threshold and caps its arenas; True where it could (Linux with glibc)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and others: no libc.so.6 or no mallopt
        return False
    settings = ((_M_MMAP_THRESHOLD, MMAP_THRESHOLD), (_M_TRIM_THRESHOLD, TRIM_THRESHOLD), (_M_ARENA_MAX, ARENA_MAX))
    return all(mallopt(parameter, value) == 1 for parameter, value in settings)
