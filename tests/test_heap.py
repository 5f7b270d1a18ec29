"""``oasr.heap.bound_heap``: after it, a process that frees large buffers between small live ones gives the
memory back; without it, glibc's rising mmap threshold keeps it in the heap."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

PROGRAM = textwrap.dedent("""
    import sys
    import numpy as np
    from oasr.heap import bound_heap

    def rss_mib():
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024

    if sys.argv[1] == "bound":
        assert bound_heap()
    base = rss_mib()
    del_me = np.ones(16 << 20, dtype=np.uint8)
    del del_me  # glibc raises its threshold to 16 MiB on this free, unless it is fixed
    live = []
    for _ in range(50):
        buffers = [np.ones(4 << 20, dtype=np.uint8) for _ in range(4)]  # an upload's worth of samples
        live.append(np.ones(2000, dtype=np.uint8))  # a small object that outlives them, between them
        del buffers
    print(rss_mib() - base)
""")


def grown_mib(mode: str) -> float:
    out = subprocess.run([sys.executable, "-c", PROGRAM, mode], capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_freed_request_buffers_go_back_to_the_system() -> None:
    bounded, unbounded = grown_mib("bound"), grown_mib("default")
    assert bounded < 4
    assert unbounded > bounded + 8  # what the setting prevents: glibc keeps the buffers in its heap


TRIM_PROGRAM = textwrap.dedent("""
    import sys
    import numpy as np
    from oasr.heap import HeapTrimmer

    def rss_mib():
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024

    small = [np.ones(50_000, dtype=np.uint8) for _ in range(2000)]  # 100 MB of heap-sized objects
    keep = small[::50]  # a few stay live, spread through the heap, so its top cannot simply shrink
    del small
    before = rss_mib()
    trimmer = HeapTrimmer(interval_s=60.0)
    assert trimmer.maybe_trim() and not trimmer.maybe_trim()  # at most once per interval
    print(before - rss_mib())
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_the_trimmer_returns_the_free_pages_between_live_objects() -> None:
    out = subprocess.run([sys.executable, "-c", TRIM_PROGRAM], capture_output=True, text=True, check=True)
    assert float(out.stdout.strip()) > 50
