"""Zeroed cache tensors whose host pages cost memory only once they are written.

Shared by every cache the engine sizes from a budget: the decoders' K/V pools (``oasr.engine.memory``) and the
streams' state pool (``oasr.streaming.state_pool``). It sits below both so neither imports the other for it.
"""

from __future__ import annotations

import math
import mmap

import torch


def cache_zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zeroed cache tensor. On the host it lies in an anonymous mapping: the kernel supplies zeroed pages as
    they are first written, so a pool sized for the budget is resident only as far as requests have used it
    (with the lowest slots and blocks handed out first, that is the peak load's share)."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    count = math.prod(shape)
    # Private: a page read before it is written maps the kernel's shared zero page and costs nothing (a shared
    # mapping would allocate it).
    mapping = mmap.mmap(-1, max(count * dtype.itemsize, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,
                        prot=mmap.PROT_READ | mmap.PROT_WRITE)
    return torch.frombuffer(mapping, dtype=dtype, count=count).view(shape)
