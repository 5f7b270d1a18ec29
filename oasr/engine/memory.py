"""Turning a memory budget into slots and cache blocks, before anything is allocated.

The budget holds the decoder's caches: self-attention K/V in a pool of blocks, and cross-attention K/V either per
slot (models that attend to a fixed window: every slot holds one window) or in a second pool of blocks sized by
each request's own encoder length. Decoder-only models have no cross-attention share.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from oasr.cache_memory import cache_zeros
from oasr.engine.config import CacheConfig
from oasr.errors import OASRError
from oasr.layers.kv_format import KVFormat
from oasr.models.base import DecoderSpec

_AUTO_GPU_FRACTION = 0.4
# On a host the default budget holds this many full-length requests (cross and self-attention both): a CPU
# decodes few rows at a time, and more slots would only hold memory.
_HOST_REQUESTS = 8
_CROSS_SHARE = 0.8  # of the budget, at most, for fixed-window cross-attention slots; the rest is the block pool
_PAGED_CROSS_SHARE = 0.5  # of the budget for cross-attention blocks when requests attend to their own length


@dataclass(frozen=True)
class MemoryPlan:
    num_slots: int
    num_blocks: int  # self-attention blocks, the null block included
    budget_bytes: int
    cross_bytes: int
    pool_bytes: int
    num_cross_blocks: int = 0  # cross-attention blocks (variable-length models), the null block included


def kv_zeros(fmt: KVFormat, layers: int, num_blocks: int, block_size: int, heads: int, head_dim: int,
             device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One of K or V for every layer, zeroed, in ``fmt`` (``oasr.layers.kv_format``): (data [layers, num_blocks *
    block_size, heads, head_dim], scale [layers, num_blocks, heads, block_size] or None)."""
    data = cache_zeros((layers, num_blocks * block_size, heads, head_dim), fmt.storage_dtype, device)
    scale = cache_zeros((layers, num_blocks, heads, block_size), torch.float32, device) if fmt.scaled else None
    return data, scale


def budget_bytes(cache: CacheConfig, device: torch.device, spec: DecoderSpec, fmt: KVFormat) -> int:
    """The configured budget; else 40% of the GPU's free memory, or on a host room for ``_HOST_REQUESTS``
    requests of the model's longest length (whatever the model's size)."""
    if cache.memory_budget_bytes is not None:
        return cache.memory_budget_bytes
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * _AUTO_GPU_FRACTION)
    per_request = -(-spec.max_positions // cache.block_size) * _kv_bytes(spec, cache.block_size, fmt)
    share = 1.0
    if spec.cross is not None:
        per_request += _kv_bytes(spec, spec.cross.max_len, fmt)
        share = _CROSS_SHARE if spec.cross.fixed else _PAGED_CROSS_SHARE
    # The null blocks and the cross-attention share's rounding: a little over, never under.
    return int(_HOST_REQUESTS * per_request / share) + 2 * per_request


def _kv_bytes(spec: DecoderSpec, positions: int, fmt: KVFormat) -> int:
    """K and V of every layer for ``positions`` positions (self- or cross-attention: same heads and sizes)."""
    return 2 * spec.num_layers * positions * fmt.position_bytes(spec.num_kv_heads, spec.head_dim)


def plan_memory(spec: DecoderSpec, cache: CacheConfig, *, max_num_seqs: int, fmt: KVFormat,
                device: torch.device) -> MemoryPlan:
    """Slots and blocks for ``max_num_seqs`` decoding rows within the budget, K/V held in ``fmt``."""
    budget = budget_bytes(cache, device, spec, fmt)
    per_block = _kv_bytes(spec, cache.block_size, fmt)
    full_sequence_blocks = -(-spec.max_positions // cache.block_size)
    slots, cross_bytes, num_cross_blocks = max_num_seqs, 0, 0
    if spec.cross is not None and spec.cross.fixed:
        per_slot = _kv_bytes(spec, spec.cross.max_len, fmt)
        slots = min(max_num_seqs, int(budget * _CROSS_SHARE) // per_slot)
        if slots < 1:
            raise OASRError(f"memory budget {budget / 2**20:.0f} MiB cannot hold one request's cross-attention K/V "
                            f"({per_slot / 2**20:.1f} MiB); raise CacheConfig.memory_budget_bytes")
        cross_bytes = slots * per_slot
    elif spec.cross is not None:
        per_cross_block = _kv_bytes(spec, cache.cross_block_size, fmt)
        num_cross_blocks = int(budget * _PAGED_CROSS_SHARE) // per_cross_block
        longest = -(-spec.cross.max_len // cache.cross_block_size)
        if num_cross_blocks < 1 + longest:
            raise OASRError(f"memory budget {budget / 2**20:.0f} MiB cannot hold one {spec.cross.max_len}-position "
                            "request's cross-attention K/V; raise CacheConfig.memory_budget_bytes")
        cross_bytes = num_cross_blocks * per_cross_block
    num_blocks = cache.num_blocks or (budget - cross_bytes) // per_block
    # The null block plus one full-length sequence must always fit, or a lone long request could never finish.
    if num_blocks < 1 + full_sequence_blocks:
        raise OASRError(f"KV pool of {num_blocks} blocks cannot hold one {spec.max_positions}-position sequence "
                        f"({1 + full_sequence_blocks} blocks needed)")
    return MemoryPlan(slots, int(num_blocks), budget, cross_bytes, int(num_blocks) * per_block, num_cross_blocks)
