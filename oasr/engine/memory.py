"""Turning a memory budget into cross-attention slots and self-attention blocks, before anything is allocated."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from oasr.engine.config import CacheConfig
from oasr.engine.kv_cache import KVShape
from oasr.errors import OASRError

_AUTO_GPU_FRACTION = 0.4
_AUTO_CPU_BYTES = 1 << 30
_CROSS_SHARE = 0.8  # of the budget, at most, for cross-attention slots; the rest is the block pool


@dataclass(frozen=True)
class MemoryPlan:
    num_slots: int
    num_blocks: int
    budget_bytes: int
    cross_bytes: int
    pool_bytes: int


def budget_bytes(cache: CacheConfig, device: torch.device) -> int:
    if cache.memory_budget_bytes is not None:
        return cache.memory_budget_bytes
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * _AUTO_GPU_FRACTION)
    return _AUTO_CPU_BYTES


def plan_memory(
    shape: KVShape, cache: CacheConfig, *, max_num_seqs: int, max_positions: int, dtype: torch.dtype, device: torch.device
) -> MemoryPlan:
    budget = budget_bytes(cache, device)
    per_slot = shape.cross_bytes_per_slot(dtype)
    per_block = shape.self_bytes_per_block(cache.block_size, dtype)
    full_sequence_blocks = -(-max_positions // cache.block_size)
    slots = min(max_num_seqs, int(budget * _CROSS_SHARE) // per_slot)
    if slots < 1:
        raise OASRError(f"memory budget {budget / 2**20:.0f} MiB cannot hold one request's cross-attention K/V "
                        f"({per_slot / 2**20:.1f} MiB); raise CacheConfig.memory_budget_bytes")
    num_blocks = cache.num_blocks or (budget - slots * per_slot) // per_block
    # The null block plus one full-length sequence must always fit, or a lone long request could never finish.
    if num_blocks < 1 + full_sequence_blocks:
        raise OASRError(f"KV pool of {num_blocks} blocks cannot hold one {max_positions}-position sequence "
                        f"({1 + full_sequence_blocks} blocks needed)")
    return MemoryPlan(slots, int(num_blocks), budget, slots * per_slot, int(num_blocks) * per_block)
