"""Rotary position embeddings (RoPE), in the half-split layout of Llama / Qwen checkpoints.

Each head vector [D] is read as two halves (x1, x2); position p rotates the pair (x1[i], x2[i]) by the angle
p * theta^(-2i / D). The angles depend only on positions, so ``RotaryEmbedding`` computes their cosines and sines
once per forward (in float32) and every attention layer applies them to its queries and keys with
``apply_rotary``. Attention scores then depend on the distance between positions only.
"""

from __future__ import annotations

import torch
from torch import nn


class RotaryEmbedding(nn.Module):
    """positions [B, T] -> (cos, sin), each float32 [B, 1, T, head_dim], for ``apply_rotary``. No parameters."""

    def __init__(self, head_dim: int, theta: float = 10_000.0) -> None:
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"rotary embeddings need an even head_dim, got {head_dim}")
        self.head_dim = head_dim
        self.theta = theta
        # Not a checkpoint key: derived from the config, so kept out of the state dict.
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        angles = positions[..., None].float() * self.inv_freq.float()  # [B, T, D / 2]
        angles = torch.cat((angles, angles), dim=-1)[:, None]  # [B, 1, T, D]
        return angles.cos(), angles.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """[..., D] -> [..., D]: (x1, x2) -> (-x2, x1) over the two halves of the last axis."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [B, H, T, D] queries or keys; cos, sin: [B, 1, T, D] (``RotaryEmbedding``) -> x rotated, in x's dtype."""
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return x * cos + rotate_half(x) * sin
