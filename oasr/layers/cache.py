"""The self-attention cache seam: models hand a cache their new queries, keys and values; it stores the keys and
values and does the attention.

A model never knows how its cache is stored, nor which kernel reads it. ``FullContext`` serves teacher forcing
(no cache, causal mask); the engine's paged block pool (``oasr.engine.kv_cache``) serves incremental decoding.
"""

from __future__ import annotations

from typing import Protocol

import torch

from oasr.layers.attention import sdpa


class SelfAttentionCache(Protocol):
    def attend(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, use_kernel: bool = False
    ) -> torch.Tensor:
        """Stores the new keys/values (k, v: [B, H, T, D]) of ``layer`` and attends the new queries (q: [B, H, T, D])
        to every stored position up to each query's own -> [B, H, T, D]. ``use_kernel``: the caller's layer runs
        under the ``kernels`` backend, so a cache with its own attention kernel may use it."""
        ...


class FullContext:
    """No cache: the T new tokens are the whole sequence, attended causally."""

    def attend(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, use_kernel: bool = False
    ) -> torch.Tensor:
        return sdpa(q, k, v, is_causal=k.shape[2] > 1)
