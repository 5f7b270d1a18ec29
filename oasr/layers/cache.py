"""The attention cache seams of a decoder.

Self-attention: models hand a cache their new queries, keys and values; it stores the keys and values and does
the attention. Cross-attention: the encoder's keys and values are projected once per request (``cross_kv_into``
of an encoder-decoder model) and stored by the caller; the model hands the cache its queries only.

A model never knows how its caches are stored, nor which kernel reads them. ``FullContext`` and ``DenseCross``
serve teacher forcing and reference loops (no cache, plain tensors); the engine's paged block pools
(``oasr.engine.kv_cache``) serve incremental decoding.
"""

from __future__ import annotations

from typing import Protocol

import torch

from oasr.layers.sdpa import sdpa


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


class CrossAttentionCache(Protocol):
    def attend(self, layer: int, q: torch.Tensor, *, use_kernel: bool = False) -> torch.Tensor:
        """Attends the queries of ``layer`` (q: [B, H, T, D]) to each row's encoder positions -> [B, H, T, D]."""
        ...

    def keys(self, layer: int) -> torch.Tensor:
        """The keys of ``layer`` as a dense [B, H, S, D] view or copy (word alignment reads them)."""
        ...


class DenseCross:
    """Cross-attention K/V as plain tensors, each [layers, B, H, S, D] (or a sequence of [B, H, S, D] per layer).
    ``lengths`` ([B] int64, optional): valid encoder positions of each row; positions past them are masked."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor | None = None) -> None:
        self.k = k
        self.v = v
        self.lengths = lengths

    def attend(self, layer: int, q: torch.Tensor, *, use_kernel: bool = False) -> torch.Tensor:
        k, v = self.k[layer], self.v[layer]
        mask = None
        if self.lengths is not None:
            span = torch.arange(k.shape[2], device=k.device)
            mask = (span[None, :] < self.lengths[:, None].to(k.device))[:, None, None, :]
        return sdpa(q, k, v, mask=mask)

    def keys(self, layer: int) -> torch.Tensor:
        return self.k[layer]
