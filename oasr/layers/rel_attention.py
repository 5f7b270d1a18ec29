"""Self-attention with relative positions (Transformer-XL, Dai et al. 2019, section 3.3 and appendix B).

Conformer encoders (FastConformer/Parakeet, Canary, U2++) score query i against key j as

    (q_i + u) . k_j  +  (q_i + v) . r_(i-j)

where ``r`` projects a sinusoidal embedding of the distance i - j and ``u``, ``v`` are learnt per-head biases.
Parameter names follow the Hugging Face Parakeet layout (``q_proj``/``k_proj``/``v_proj``/``o_proj``,
``relative_k_proj``, ``bias_u``, ``bias_v``).
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from oasr.layers.basic import Linear

_POSITION_BASE = 10_000.0


def relative_position_embeddings(
    num_frames: int, dim: int, *, device: torch.device, dtype: torch.dtype
) -> torch.Tensor:
    """Sinusoids for the distances T-1, T-2, ..., -(T-1), sin and cos interleaved -> [1, 2T-1, dim]."""
    distances = torch.arange(num_frames - 1, -num_frames, -1, device=device, dtype=torch.float32)
    inv_freq = 1.0 / (_POSITION_BASE ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)).to(device)
    angles = distances[:, None] * inv_freq[None, :]
    return torch.stack([angles.sin(), angles.cos()], dim=-1).reshape(1, 2 * num_frames - 1, dim).to(dtype)


def relative_shift(scores: torch.Tensor) -> torch.Tensor:
    """[B, H, T, 2T-1] scores by (query i, distance slot p = T-1-(i-j)) -> [B, H, T, T] by (query i, key j).

    The Transformer-XL shift as a strided view, without copying: query row i starts at its own distance slot
    T-1-i and moves one slot per key, so element (i, j) sits at flat offset T-1 + i*(2T-2) + j of each head's
    [T, 2T-1] matrix.
    """
    b, h, t, num_slots = scores.shape
    scores = scores.contiguous()
    strides = (h * t * num_slots, t * num_slots, num_slots - 1, 1)
    return scores.as_strided((b, h, t, t), strides, scores.storage_offset() + t - 1)


class RelPositionMultiHeadAttention(nn.Module):
    KERNEL_OP: ClassVar[str] = "rel_pos_attention"

    def __init__(self, embed_dim: int, num_heads: int, *, bias: bool = True) -> None:
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim {embed_dim} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.q_proj = Linear(embed_dim, embed_dim, bias=bias)
        self.k_proj = Linear(embed_dim, embed_dim, bias=bias)
        self.v_proj = Linear(embed_dim, embed_dim, bias=bias)
        self.o_proj = Linear(embed_dim, embed_dim, bias=bias)
        self.relative_k_proj = Linear(embed_dim, embed_dim, bias=False)
        self.bias_u = nn.Parameter(torch.zeros(num_heads, self.head_dim))  # content bias u
        self.bias_v = nn.Parameter(torch.zeros(num_heads, self.head_dim))  # position bias v

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """[B, T, H*D] -> [B, H, T, D]."""
        b, t, _ = x.shape
        return x.view(b, t, self.num_heads, self.head_dim).transpose(1, 2)

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, key_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """x: [B, T, E]; positions: [1|B, 2T-1, E] from ``relative_position_embeddings``;
        key_mask: bool [B, T] (True = a real frame) -> [B, T, E].

        Padded keys get no weight; padded queries still attend to the real frames (their outputs are never read).
        """
        q = self.split_heads(self.q_proj(x))
        k = self.split_heads(self.k_proj(x))
        v = self.split_heads(self.v_proj(x))
        r = self.split_heads(self.relative_k_proj(positions))  # [1|B, H, 2T-1, D]
        scale = self.head_dim**-0.5
        # Scaled on the (small) query side, so the [B, H, T, 2T-1] product is read once more, by the shift below.
        position_scores = relative_shift(((q + self.bias_v[:, None]) * scale) @ r.transpose(-1, -2))
        if key_mask is not None:
            # The most negative finite value, not -inf: a row with no real frame stays finite.
            floor = torch.finfo(position_scores.dtype).min
            position_scores = torch.where(key_mask[:, None, None, :], position_scores, floor)
        else:
            position_scores = position_scores.contiguous()
        # SDPA adds the float mask to the scaled content scores (q + u) . k: both terms share one softmax.
        out = F.scaled_dot_product_attention(q + self.bias_u[:, None], k, v, attn_mask=position_scores)
        b, _, t, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))
