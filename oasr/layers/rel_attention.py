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

from oasr.kernels import rel_position
from oasr.layers.basic import Linear
from oasr.layers.shared_input import SharedInput

_POSITION_BASE = 10_000.0


def relative_position_embeddings(
    num_frames: int, dim: int, *, device: torch.device, dtype: torch.dtype, num_keys: int | None = None
) -> torch.Tensor:
    """Sinusoids for the distances K-1, K-2, ..., -(T-1), sin and cos interleaved -> [1, K+T-1, dim]: T queries
    that are the last of K keys (K = T, the default: the whole sequence attends to itself)."""
    num_keys = num_frames if num_keys is None else num_keys
    distances = torch.arange(num_keys - 1, -num_frames, -1, device=device, dtype=torch.float32)
    # Made on the device: a host tensor copied there would make the host wait for the device's queued work.
    inv_freq = 1.0 / (_POSITION_BASE ** (torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim))
    angles = distances[:, None] * inv_freq[None, :]
    return torch.stack([angles.sin(), angles.cos()], dim=-1).reshape(1, num_keys + num_frames - 1, dim).to(dtype)


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
    """Under the ``kernels`` backend the position term is shifted, biased and masked by one Triton pass
    (``oasr.kernels.rel_position``); attention itself is SDPA either way."""

    KERNEL_OP: ClassVar[str] = "rel_pos_attention"
    use_kernel = False  # set by oasr.layers.apply_backend

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

    def _project_q_u(self, x: SharedInput, u: torch.Tensor) -> torch.Tensor:
        """Queries with the content bias u added [B, T, E]: by the projection's own bias in one GEMM, or after a
        quantized projection (which takes no other bias)."""
        if self.q_proj.quant_gemm is not None:
            return x(self.q_proj) + u
        return F.linear(x.x, self.q_proj.weight, u if self.q_proj.bias is None else self.q_proj.bias + u)

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """[B, T, H*D] -> [B, H, T, D]."""
        b, t, _ = x.shape
        return x.view(b, t, self.num_heads, self.head_dim).transpose(1, 2)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        key_mask: torch.Tensor | None = None,
        pair_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x: [B, T, E]; positions: [1|B, 2T-1, E] from ``relative_position_embeddings``;
        key_mask: bool [B, T] (True = a real frame); pair_mask: bool [T, T] by (query, key), True where the query
        may attend (a limited context window), shared by the batch -> [B, T, E].

        Padded keys get no weight; padded queries still attend to the real frames (their outputs are never read).
        A query must be allowed at least one real key (itself, in every window in use) for its output to mean
        anything.
        """
        b, t, _ = x.shape
        # Queries with the content bias u added by the projection itself: (q + u) comes out of one GEMM.
        u = self.bias_u.flatten()
        shared = SharedInput(x)  # quantized projections share one quantization of x
        q_u = self._project_q_u(shared, u)
        q_u = q_u.view(b, t, self.num_heads, self.head_dim)
        k = self.split_heads(shared(self.k_proj))
        v = self.split_heads(shared(self.v_proj))
        # The float mask SDPA adds to the scaled content scores (q + u) . k, so both terms share one softmax.
        # (Under the kernels backend on CPU tensors the kernel's torch reference runs: the same arithmetic.)
        if self.use_kernel and positions.shape[0] == 1 and not torch.compiler.is_compiling():
            mask = self.position_mask(q_u, positions, key_mask)
        else:
            position_scores = self.position_scores(q_u, positions, self.bias_v - self.bias_u)
            mask = rel_position.mask_buffer(b, self.num_heads, t, position_scores.dtype, position_scores.device)
            if key_mask is None:
                mask.copy_(position_scores)
            else:
                # The most negative finite value, not -inf: a row with no real frame stays finite.
                floor = mask.new_full((), torch.finfo(mask.dtype).min)
                torch.where(key_mask[:, None, None, :], position_scores, floor, out=mask)
        if pair_mask is not None:
            mask.masked_fill_(~pair_mask, torch.finfo(mask.dtype).min)
        out = F.scaled_dot_product_attention(q_u.transpose(1, 2), k, v, attn_mask=mask)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))

    def attend_in_window(
        self, x: torch.Tensor, positions: torch.Tensor, window_keys: torch.Tensor, window_values: torch.Tensor,
        past_valid: torch.Tensor, chunk_valid: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """A chunk attending to itself and to the frames before it (cache-aware streaming).

        x: [B, T, E] the chunk; window_keys, window_values: [B, H, L+T, D], the projected keys and values of the L
        frames before the chunk (oldest first) followed by room for the chunk's own, which are written there in
        place; past_valid: bool [B, L], False where a row has no such frame yet (a stream's start) or its window
        does not reach it; positions: [1, L+2T-1, E] from ``relative_position_embeddings`` with
        ``num_keys=L+T`` -> out [B, T, E]. Every query sees every key of its chunk, but those ``chunk_valid``
        (bool [B, T]) marks False: a stream's last chunk's frames past its audio, under NeMo's tail rule.
        """
        b, t, _ = x.shape
        u = self.bias_u.flatten()
        shared = SharedInput(x)
        q_u = self._project_q_u(shared, u)
        q_u = q_u.view(b, t, self.num_heads, self.head_dim)
        num_keys = window_keys.shape[2]
        window_keys[:, :, num_keys - t:] = self.split_heads(shared(self.k_proj))
        window_values[:, :, num_keys - t:] = self.split_heads(shared(self.v_proj))
        q_v = (q_u + (self.bias_v - self.bias_u)).permute(2, 0, 1, 3).reshape(self.num_heads, b * t, self.head_dim)
        scores = rel_position.shifted(torch.bmm(q_v, self.distance_keys(positions)), b, num_keys)
        valid = torch.cat([past_valid, past_valid.new_ones(b, t) if chunk_valid is None else chunk_valid], dim=1)
        mask = torch.where(valid[:, None, None, :], scores, torch.finfo(scores.dtype).min)
        out = F.scaled_dot_product_attention(q_u.transpose(1, 2), window_keys, window_values, attn_mask=mask)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))

    def distance_keys(self, positions: torch.Tensor) -> torch.Tensor:
        """positions: [1, P, E] (P = 2T-1, or K+T-1 with earlier keys) -> the scaled projected distances
        [H, D, W], W = P rounded up to a multiple of 8 (odd widths fall to slow unaligned GEMM kernels; the extra
        slots are zero)."""
        num_slots = positions.shape[1]
        width = -(-num_slots // 8) * 8
        r = self.relative_k_proj(positions[0]) * self.head_dim**-0.5  # the scale goes on the small operand
        return F.pad(r, (0, 0, 0, width - num_slots)).view(width, self.num_heads, self.head_dim).permute(1, 2, 0)

    def position_mask(
        self, q: torch.Tensor, positions: torch.Tensor, key_mask: torch.Tensor | None
    ) -> torch.Tensor:
        """q: [B, T, H, D] queries with u; positions: [1, 2T-1, E] -> SDPA's float mask [B, H, T, T] through
        ``oasr.kernels.rel_position``: the multiply takes q as it is, and v - u comes in as a per-distance bias
        ((v - u) . r, [H, W]) added while the kernel shifts and masks."""
        b, t, h, d = q.shape
        r = self.distance_keys(positions)
        scores = torch.bmm(q.permute(2, 0, 1, 3).reshape(h, b * t, d), r)  # [H, B*T, W]
        slot_bias = torch.einsum("hd,hdw->hw", (self.bias_v - self.bias_u).float(), r.float())
        if key_mask is None:
            key_mask = torch.ones(b, t, dtype=torch.bool, device=q.device)
        return rel_position.position_mask(scores, slot_bias, key_mask)

    def position_scores(self, q: torch.Tensor, positions: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
        """q: [B, T, H, D] queries; positions: [1|B, 2T-1, E]; shift: [H, D] -> scaled (q + shift) . r scores
        [B, H, T, T] by (query, key), a strided view. (Given q + u, the shift v - u makes the position bias v.)

        With positions shared by the batch, each head is one matrix multiply over all B*T queries against the
        distances (``distance_keys``).
        """
        b, t, h, d = q.shape
        q_v = q + shift
        if positions.shape[0] != 1:
            r = self.relative_k_proj(positions) * self.head_dim**-0.5  # [B, 2T-1, E]
            scores = q_v.transpose(1, 2) @ self.split_heads(r).transpose(-1, -2)  # [B, H, T, 2T-1]
            return relative_shift(scores)
        # [H, B*T, D] is a view of q_v's [B, T, H, D] memory: batched GEMMs take strided operands.
        scores = torch.bmm(q_v.permute(2, 0, 1, 3).reshape(h, b * t, d), self.distance_keys(positions))
        return rel_position.shifted(scores, b)
