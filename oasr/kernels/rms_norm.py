"""RMSNorm in one pass: after a residual add (``add_rms_norm``), or per attention head followed by its rotary
rotation (``rms_norm_rotary``, Qwen3's q/k norms).

In torch an RMSNorm is six passes over its input (cast to float32, square, mean, rsqrt, scale, cast back, gain)
and the residual add before it one more; a Qwen3 decoder layer has two such norms and the q/k norms, whose
output is then rotated (four passes more) and transposed to heads-first. These kernels read each row once and
write it once. Statistics are float32; the normalised row is rounded to the input's dtype before the gain
multiplies it, as the torch path (and transformers) round.

The ``*_reference`` functions are the torch paths; they serve where Triton cannot run and in the equivalence
tests.
"""

from __future__ import annotations

import torch

from oasr.kernels.runtime import residual_rows, triton_runs_on

try:
    import triton
    import triton.language as tl
except ImportError:  # the torch reference serves
    triton = None


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., D] -> weight * x / sqrt(mean(x^2) + eps), statistics in float32, in x's dtype."""
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


def add_rms_norm_reference(x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (s = x + delta (x itself when delta is None), rms_norm(s)), both in x's dtype."""
    s = x if delta is None else x + delta
    return s, rms_norm_reference(s, weight, eps)


def rms_norm_rotary_reference(x: torch.Tensor, weight: torch.Tensor, eps: float, cos: torch.Tensor,
                              sin: torch.Tensor) -> torch.Tensor:
    """x: [B, T, H, D] heads as projected; weight [D]; cos, sin: float32 [B, 1, T, D] (``RotaryEmbedding``)
    -> every head normalised, then rotated, heads first: [B, H, T, D] in x's dtype."""
    from oasr.layers.rotary import apply_rotary

    return apply_rotary(rms_norm_reference(x, weight, eps).transpose(1, 2), cos, sin)


def supported(x: torch.Tensor) -> bool:
    return triton_runs_on(x)


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """``add_rms_norm_reference`` in one kernel where ``supported``."""
    if not supported(x):
        return add_rms_norm_reference(x, delta, weight, eps)
    dim = x.shape[-1]
    rows, delta, total, normed = residual_rows(x, delta)
    block = triton.next_power_of_2(dim)
    _add_rms_norm_kernel[(rows.shape[0],)](
        rows, delta if delta is not None else rows, weight, total, normed, dim, eps,
        HAS_DELTA=delta is not None, BLOCK=block, num_warps=min(max(block // 256, 1), 8),
    )
    return total.view(x.shape), normed.view(x.shape)


def rms_norm_rotary(x: torch.Tensor, weight: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor
                    ) -> torch.Tensor:
    """``rms_norm_rotary_reference`` in one kernel where ``supported`` (an even, power-of-two head size)."""
    b, t, h, d = x.shape
    if not supported(x) or d & (d - 1) or d < 2:
        return rms_norm_rotary_reference(x, weight, eps, cos, sin)
    x = x if x.is_contiguous() else x.contiguous()
    # One (cos, sin) row per token: [B * T, D / 2] (the two halves of a RotaryEmbedding row are equal).
    cos = cos.expand(b, 1, t, d)[:, 0, :, : d // 2].reshape(b * t, d // 2).contiguous()
    sin = sin.expand(b, 1, t, d)[:, 0, :, : d // 2].reshape(b * t, d // 2).contiguous()
    out = torch.empty((b, h, t, d), dtype=x.dtype, device=x.device)
    _rms_norm_rotary_kernel[(b * t, h)](x, weight, cos, sin, out, t, eps, NUM_HEADS=h, HALF=d // 2, num_warps=1)
    return out


if triton is not None:

    @triton.jit
    def _add_rms_norm_kernel(x_ptr, delta_ptr, w_ptr, total_ptr, out_ptr, dim, eps,
                             HAS_DELTA: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        inside = cols < dim
        x = tl.load(x_ptr + row * dim + cols, mask=inside, other=0.0)
        if HAS_DELTA:
            x = (x.to(tl.float32) + tl.load(delta_ptr + row * dim + cols, mask=inside, other=0.0).to(tl.float32))
            x = x.to(total_ptr.dtype.element_ty)  # normalise the sum as stored, as torch does
            tl.store(total_ptr + row * dim + cols, x, mask=inside)
        x = x.to(tl.float32)
        scale = tl.rsqrt(tl.sum(x * x, axis=0) / dim + eps)
        y = (x * scale).to(out_ptr.dtype.element_ty).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=inside, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * dim + cols, (w * y).to(out_ptr.dtype.element_ty), mask=inside)

    @triton.jit
    def _rms_norm_rotary_kernel(x_ptr, w_ptr, cos_ptr, sin_ptr, out_ptr, seq_len, eps,
                                NUM_HEADS: tl.constexpr, HALF: tl.constexpr):
        token = tl.program_id(0).to(tl.int64)  # b * T + t
        head = tl.program_id(1).to(tl.int64)
        i = tl.arange(0, HALF)
        src = (token * NUM_HEADS + head) * (2 * HALF)
        x1 = tl.load(x_ptr + src + i).to(tl.float32)
        x2 = tl.load(x_ptr + src + HALF + i).to(tl.float32)
        scale = tl.rsqrt((tl.sum(x1 * x1, axis=0) + tl.sum(x2 * x2, axis=0)) / (2 * HALF) + eps)
        dtype = out_ptr.dtype.element_ty
        w1 = tl.load(w_ptr + i).to(tl.float32)
        w2 = tl.load(w_ptr + HALF + i).to(tl.float32)
        y1 = (w1 * (x1 * scale).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
        y2 = (w2 * (x2 * scale).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
        c = tl.load(cos_ptr + token * HALF + i).to(dtype).to(tl.float32)
        s = tl.load(sin_ptr + token * HALF + i).to(dtype).to(tl.float32)
        batch = token // seq_len
        step = token % seq_len
        dst = ((batch * NUM_HEADS + head) * seq_len + step) * (2 * HALF)
        tl.store(out_ptr + dst + i, (y1 * c - y2 * s).to(dtype))
        tl.store(out_ptr + dst + HALF + i, (y2 * c + y1 * s).to(dtype))
