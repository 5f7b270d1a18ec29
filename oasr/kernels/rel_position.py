"""The Transformer-XL position term of relative-position attention, shifted, biased and masked in one pass.

Relative-position attention (``oasr.layers.rel_attention``) adds ``(q_i + v) . r_(i-j)`` to the content score of
query i and key j. Torch builds it in three passes: ``q + (v - u)`` over every query, a matrix multiply against
the 2T-1 distance embeddings, and a masked copy that reads the product through the shift (a strided view) into
SDPA's float mask. Here the multiply takes the queries as they come (with u, from the projection) and this
kernel does the rest: it reads the product through the shift, adds the per-distance bias ``(v - u) . r`` (a
[H, 2T-1] table), puts the floor on padded keys and writes the aligned mask, once.

``position_mask_reference`` is the same arithmetic in torch: it serves CPU tensors and the equivalence test.
"""

from __future__ import annotations

import torch

from oasr.kernels.runtime import triton_runs_on

try:
    import triton
    import triton.language as tl
except ImportError:  # the torch reference serves
    triton = None


def mask_buffer(batch: int, heads: int, frames: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An empty [B, H, T, T] mask: a view of a buffer whose rows are padded to a multiple of 8 elements (SDPA
    copies unaligned masks)."""
    return torch.empty(batch, heads, frames, -(-frames // 8) * 8, dtype=dtype, device=device)[..., :frames]


def shifted(scores: torch.Tensor, batch: int, num_keys: int | None = None) -> torch.Tensor:
    """Contiguous [H, B*T, W] scores by (query, distance slot) -> a [B, H, T, K] view by (query, key): query i
    of each row starts at its own slot T-1-i and moves one slot per key (the Transformer-XL shift). K defaults
    to T; a chunk streamed after K - T earlier keys has K > T (then W >= K + T - 1)."""
    heads, rows, width = scores.shape
    frames = rows // batch
    strides = (frames * width, rows * width, width - 1, 1)
    shape = (batch, heads, frames, frames if num_keys is None else num_keys)
    return scores.as_strided(shape, strides, scores.storage_offset() + frames - 1)


def position_mask_reference(
    scores: torch.Tensor, slot_bias: torch.Tensor, key_mask: torch.Tensor
) -> torch.Tensor:
    """scores: [H, B*T, W] (query . r for every distance slot, slot T-1-i+j for key j; W >= 2T-1);
    slot_bias: float32 [H, W]; key_mask: bool [B, T] (True = a real key)
    -> [B, H, T, T] in scores' dtype: scores shifted to (query, key) plus the bias of the pair's slot, and the
    dtype's most negative finite value at padded keys (finite, so a row with no real key stays finite)."""
    batch, frames = key_mask.shape
    total = shifted((scores.float() + slot_bias[:, None, :]).contiguous(), batch)
    floor = torch.finfo(scores.dtype).min
    out = mask_buffer(batch, scores.shape[0], frames, scores.dtype, scores.device)
    return out.copy_(torch.where(key_mask[:, None, None, :], total, floor))


def supported(scores: torch.Tensor) -> bool:
    return triton_runs_on(scores)


def position_mask(scores: torch.Tensor, slot_bias: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
    """``position_mask_reference`` in one kernel where ``supported``."""
    if not supported(scores):
        return position_mask_reference(scores, slot_bias, key_mask)
    heads, rows, width = scores.shape
    batch, frames = key_mask.shape
    if rows != batch * frames or width < 2 * frames - 1 or slot_bias.shape != (heads, width):
        raise ValueError(f"scores {tuple(scores.shape)} and slot_bias {tuple(slot_bias.shape)} do not fit "
                         f"{batch} rows of {frames} frames")
    scores, slot_bias, key_mask = scores.contiguous(), slot_bias.contiguous(), key_mask.contiguous()
    out = mask_buffer(batch, heads, frames, scores.dtype, scores.device)
    block_i, block_j = 16, 128
    grid = (batch * heads, triton.cdiv(frames, block_i))
    _position_mask_kernel[grid](
        scores, slot_bias, key_mask.view(torch.int8), out, heads, frames, width, out.stride(2),
        torch.finfo(scores.dtype).min, BLOCK_I=block_i, BLOCK_J=block_j,
    )
    return out


if triton is not None:

    @triton.jit
    def _position_mask_kernel(
        scores_ptr, bias_ptr, key_mask_ptr, out_ptr, heads, frames, width, out_row_stride, floor,
        BLOCK_I: tl.constexpr, BLOCK_J: tl.constexpr,
    ):
        # One (row b, head h, BLOCK_I queries) tile per program, walking the keys BLOCK_J at a time. Query i's
        # slots for keys j.. are contiguous (slot T-1-i+j), so every load and store runs along memory.
        bh = tl.program_id(0)
        b = bh // heads
        h = bh % heads
        i = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
        i_ok = i < frames
        num_rows = tl.num_programs(0) // heads
        query_rows = (h.to(tl.int64) * num_rows + b) * frames + i  # rows of the [H, B*T, W] scores
        out_rows = bh.to(tl.int64) * frames + i
        for j0 in range(0, frames, BLOCK_J):
            j = j0 + tl.arange(0, BLOCK_J)
            j_ok = j < frames
            slot = (frames - 1) - i[:, None] + j[None, :]
            ok = i_ok[:, None] & j_ok[None, :]
            score = tl.load(scores_ptr + query_rows[:, None] * width + slot, mask=ok, other=0.0).to(tl.float32)
            bias = tl.load(bias_ptr + h * width + slot, mask=ok, other=0.0)
            real = tl.load(key_mask_ptr + b * frames + j, mask=j_ok, other=0) != 0
            value = tl.where(real[None, :], score + bias, floor)
            tl.store(out_ptr + out_rows[:, None] * out_row_stride + j[None, :],
                     value.to(out_ptr.dtype.element_ty), mask=ok)
