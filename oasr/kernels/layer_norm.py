"""LayerNorm over the last dimension, optionally after a residual add, in one pass.

Pre-norm blocks end each sublayer with ``x = x + alpha * f(h)`` and start the next with ``h = norm(x)``: in
plain torch two passes over [rows, D] (the add, then the norm, which reads the sum back). ``add_layer_norm``
reads ``x`` and the sublayer output once and writes the sum and its norm. Statistics are float32.

``add_layer_norm_reference`` is the same arithmetic in torch; it serves CPU tensors and the equivalence test.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from oasr.kernels.runtime import residual_rows, triton_runs_on

try:
    import triton
    import triton.language as tl
except ImportError:  # the torch reference serves
    triton = None


def add_layer_norm_reference(
    x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor | None, bias: torch.Tensor | None,
    eps: float, alpha: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (s = x + alpha * delta (x itself when delta is None), layer_norm(s)), both in x's dtype."""
    s = x if delta is None else torch.add(x, delta, alpha=alpha)
    return s, F.layer_norm(s, (s.shape[-1],), weight, bias, eps)


def supported(x: torch.Tensor) -> bool:
    return triton_runs_on(x)


def add_layer_norm(
    x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor | None, bias: torch.Tensor | None,
    eps: float, alpha: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``add_layer_norm_reference`` in one kernel where ``supported``."""
    if not supported(x):
        return add_layer_norm_reference(x, delta, weight, bias, eps, alpha)
    dim = x.shape[-1]
    rows, delta, total, normed = residual_rows(x, delta)
    block = triton.next_power_of_2(dim)
    _add_layer_norm_kernel[(rows.shape[0],)](
        rows, delta if delta is not None else rows, weight if weight is not None else rows,
        bias if bias is not None else rows, total, normed, dim, eps, alpha,
        HAS_DELTA=delta is not None, HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None, BLOCK=block,
        num_warps=min(max(block // 256, 1), 8),
    )
    return total.view(x.shape), normed.view(x.shape)


if triton is not None:

    @triton.jit
    def _add_layer_norm_kernel(
        x_ptr, delta_ptr, w_ptr, b_ptr, total_ptr, out_ptr, dim, eps, alpha,
        HAS_DELTA: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        inside = cols < dim
        x = tl.load(x_ptr + row * dim + cols, mask=inside, other=0.0).to(tl.float32)
        if HAS_DELTA:
            x += alpha * tl.load(delta_ptr + row * dim + cols, mask=inside, other=0.0).to(tl.float32)
            x = x.to(total_ptr.dtype.element_ty).to(tl.float32)  # normalise the sum as stored, as torch does
            tl.store(total_ptr + row * dim + cols, x.to(total_ptr.dtype.element_ty), mask=inside)
        mean = tl.sum(x, axis=0) / dim
        centred = tl.where(inside, x - mean, 0.0)
        variance = tl.sum(centred * centred, axis=0) / dim
        y = centred * tl.rsqrt(variance + eps)
        if HAS_WEIGHT:
            y *= tl.load(w_ptr + cols, mask=inside, other=0.0).to(tl.float32)
        if HAS_BIAS:
            y += tl.load(b_ptr + cols, mask=inside, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * dim + cols, y.to(out_ptr.dtype.element_ty), mask=inside)
