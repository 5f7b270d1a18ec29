"""Host caches hold resident memory for what requests use, not for the budget they were sized by."""

from __future__ import annotations

import random
from pathlib import Path

import torch

from oasr.engine.block_pool import BlockPool
from oasr.cache_memory import cache_zeros


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def test_a_host_cache_is_zero_and_resident_only_where_written():
    before = _rss_bytes()
    cache = cache_zeros((4, 1024, 256, 256), torch.float32, torch.device("cpu"))  # 1 GiB
    cache[:, :8].fill_(1.0)  # 8 of 1,024 slots in every layer: 8 MiB
    assert cache[:, :256].sum().item() == 8 * 4 * 256 * 256  # a decode step reads slots nobody wrote
    grown = _rss_bytes() - before
    assert grown < 128 << 20, f"{grown / 2**20:.0f} MiB resident for 8 MiB written and 248 MiB read"
    assert cache[:, :8].eq(1.0).all() and cache[:, 8:16].eq(0.0).all()


def test_freed_blocks_are_handed_out_again_before_untouched_ones():
    pool = BlockPool(num_blocks=10_000, block_size=16)
    rng = random.Random(0)
    held: list[list[int]] = []
    highest = 0
    for _ in range(2_000):  # at most 20 requests of at most 10 blocks at a time
        if held and (len(held) == 20 or rng.random() < 0.5):
            pool.free(held.pop(rng.randrange(len(held))))
        blocks = pool.allocate(rng.randint(1, 10))
        held.append(blocks)
        highest = max(highest, *blocks)
    assert highest <= 20 * 10, f"block {highest} handed out while at most 200 were ever held"
    assert len({b for blocks in held for b in blocks}) == sum(map(len, held)), "a block was handed out twice"
