"""The opt-in seam through which a decoder pass hands out cross-attention logits of chosen heads."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from oasr.layers import MultiHeadAttention


class CrossAttentionProbe:
    """Collects the pre-softmax cross-attention logits of (layer, head) pairs during one decoder pass.

    Heads are kept in (layer, head) order, the order openai-whisper reads its alignment heads in, so averages
    over heads sum in the same order.
    """

    def __init__(self, heads: Iterable[tuple[int, int]], device: torch.device | str) -> None:
        pairs = sorted(set(heads))
        if not pairs:
            raise ValueError("a cross-attention probe needs at least one (layer, head) pair")
        by_layer: dict[int, list[int]] = {}
        for layer, head in pairs:
            by_layer.setdefault(layer, []).append(head)
        self.heads = tuple(pairs)
        self._by_layer = {layer: torch.tensor(hs, dtype=torch.long, device=device) for layer, hs in by_layer.items()}
        self._scores: dict[int, torch.Tensor] = {}

    def observe(self, layer: int, attention: MultiHeadAttention, queries: torch.Tensor, keys: torch.Tensor) -> None:
        """Called by each decoder layer with its cross-attention queries [B, T, E] and keys [B, H, S, D]."""
        heads = self._by_layer.get(layer)
        if heads is not None:
            self._scores[layer] = attention.head_scores(queries, keys, heads)

    def scores(self) -> torch.Tensor:
        """float32 [B, num_heads, T, S] in ``self.heads`` order; fails if a layer was never observed."""
        missing = sorted(set(self._by_layer) - set(self._scores))
        if missing:
            raise RuntimeError(f"cross-attention probe saw no decoder pass through layer(s) {missing}")
        return torch.cat([self._scores[layer] for layer in sorted(self._by_layer)], dim=1)
