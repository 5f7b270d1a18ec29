"""Rounding new keys or values into an e4m3 cache in one pass (``kv_cache_dtype`` fp8).

``oasr.layers.kv_format.store`` in torch is seven passes over float32 copies of the values (at large-v3's
cross-attention, 64 windows of 1,500 positions, a quarter of a gigabyte each per layer); this kernel reads each
position's heads once, and writes their e4m3 values and scales where the cache keeps them: values at the pool
row, scales at [block, head, offset]. The numbers are ``oasr.layers.kv_format.quantize_heads``'s (the same
rounded reciprocal, clamp and round-to-nearest cast).
"""

from __future__ import annotations

import torch

from oasr.kernels.runtime import per_head_kernel_runs_on

try:
    import triton
    import triton.language as tl
except ImportError:  # the torch path serves
    triton = None


def store_scaled(data: torch.Tensor, scale: torch.Tensor, rows: torch.Tensor, values: torch.Tensor,
                 block_size: int) -> None:
    """values [N, H, D] (any float dtype) into e4m3 ``data`` [rows, H, D] at ``rows`` [N], their scales into
    ``scale`` [blocks, H, block_size]; where ``per_head_kernel_runs_on(values)``."""
    n, h, d = values.shape
    if data.stride(-1) != 1 or data.stride(1) != d or data.stride(0) != h * d or not scale.is_contiguous():
        raise ValueError("an e4m3 cache layer must be dense [rows, H, D] with scales [blocks, H, block_size]")
    values, rows = values.contiguous(), rows.contiguous()
    _store_scaled_kernel[(n,)](values, data, scale, rows, NUM_HEADS=h, HEADS_P2=triton.next_power_of_2(h),
                               HEAD_DIM=d, BLOCK_SIZE=block_size, num_warps=2 if h * d <= 2048 else 4)


if triton is not None:

    @triton.jit
    def _store_scaled_kernel(values_ptr, data_ptr, scale_ptr, rows_ptr, NUM_HEADS: tl.constexpr,
                             HEADS_P2: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr):
        """Program i: input position i, every head."""
        i = tl.program_id(0).to(tl.int64)
        heads = tl.arange(0, HEADS_P2)
        d = tl.arange(0, HEAD_DIM)
        live = heads < NUM_HEADS
        at = heads[:, None] * HEAD_DIM + d[None, :]
        x = tl.load(values_ptr + i * NUM_HEADS * HEAD_DIM + at, mask=live[:, None], other=0.0).to(tl.float32)
        scale = tl.maximum(tl.max(tl.abs(x), axis=1), 1e-12) * (1.0 / 448.0)
        inverse = tl.math.div_rn(1.0, scale)
        stored = tl.minimum(tl.maximum(x * inverse[:, None], -448.0), 448.0).to(tl.float8e4nv)
        row = tl.load(rows_ptr + i)
        tl.store(data_ptr + row * NUM_HEADS * HEAD_DIM + at, stored, mask=live[:, None])
        block = row // BLOCK_SIZE
        tl.store(scale_ptr + (block * NUM_HEADS + heads) * BLOCK_SIZE + row % BLOCK_SIZE, scale, mask=live)
