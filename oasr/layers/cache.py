"""The self-attention cache seam: models hand new K/V to a cache and attend over what it returns.

A model never knows how its cache is stored. ``FullContext`` serves teacher forcing (no cache, causal mask);
the engine's paged block pool (``oasr.engine.kv_cache``) serves incremental decoding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass
class AttentionInputs:
    """k, v: [B, H, L, D]; mask: bool [B|1, 1, T, L] (True = attend) or None; is_causal for square masks."""

    k: torch.Tensor
    v: torch.Tensor
    mask: torch.Tensor | None = None
    is_causal: bool = False


class SelfAttentionCache(Protocol):
    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> AttentionInputs:
        """Stores the new keys/values (k, v: [B, H, T, D]) of ``layer``; returns what the queries attend to."""
        ...


class FullContext:
    """No cache: the T new tokens are the whole sequence, attended causally."""

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> AttentionInputs:
        return AttentionInputs(k=k, v=v, is_causal=k.shape[2] > 1)
