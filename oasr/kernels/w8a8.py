"""The passes around a W8A8 GEMM: the activation's per-row (per-token) dynamic quantization before it, and for
int8 the rescaling of its int32 sums after it, each in one kernel.

In torch the activation's quantization is seven passes over it (cast to float32, absolute value, row maximum,
clamp, divide, saturate, cast); at an encoder's row counts they cost as much as the fp8 GEMM they feed. This
kernel reads each row from memory once (a row wider than 512 columns a second time, from L2) and writes its
quantized values and its float32 scale.

``dequantize_int32``: torch's ``acc.float() * x_scale * w_scale + bias`` cast to the output dtype is five passes
over an int32/float32 product as large as the output; here it is one, with the same float32 operations (a
multiply-add may be contracted, so the last bit can differ).

The quantization's numbers are ``QuantMethod.quantize_activation``'s: scale = max(|row|, 1e-12) * (1 / qmax) in
float32 (a multiply, as torch itself computes a division by a scalar on CUDA, so that both devices agree), values
multiplied by the scale's correctly rounded reciprocal (``div_rn`` once per row), then saturated and rounded half
to even to the storage dtype. int8 rounds in float32 arithmetic (adding and subtracting 1.5 * 2**23) before the
then exact conversion. e4m3 on CUDA is the hardware's conversion (round to nearest even, as torch's); under
Triton's interpreter (3.9), which rounds some values to the power of two below when it converts to e4m3 itself,
the kernel rounds in float32 first instead: a normal value's mantissa to its top three bits on the integer bits, a
subnormal one (below 2**-6) to a multiple of 2**-9. Either way the kernel agrees with torch bit for bit.

On the H200, 24,000 x 5,120 fp16 rows into e4m3 take 0.146 ms this way (``scripts/bench_quant_gemm.py``; about
2.5 TB/s of reads and writes); with a division per value and the float32 rounding, a profile had 0.63 ms per
96,000 such rows (0.157 ms per 24,000; not the same run).
"""

from __future__ import annotations

import torch

from oasr.kernels.runtime import triton_runs_on

try:
    import triton
    import triton.language as tl
except ImportError:  # the torch path serves
    triton = None

MIN_AMAX = 1e-12
_ROUNDER = 12582912.0  # 1.5 * 2**23: float32 addition rounds to an integer for |v| < 2**22


def supported(x: torch.Tensor, storage_dtype: torch.dtype) -> bool:
    return triton_runs_on(x) and storage_dtype in (torch.float8_e4m3fn, torch.int8) and x.dim() == 2


def quantize_rows(x: torch.Tensor, storage_dtype: torch.dtype, qmax: float) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (float16, bfloat16 or float32) -> (values [M, K] in ``storage_dtype``, float32 scales [M, 1])."""
    rows = x if x.is_contiguous() else x.contiguous()
    m, k = rows.shape
    out = torch.empty((m, k), dtype=storage_dtype, device=x.device)
    scale = torch.empty((m, 1), dtype=torch.float32, device=x.device)
    if m == 0:
        return out, scale
    # Tiles of a few rows by at most 512 columns; a wider row is read in chunks twice (its maximum, then its
    # values; the second read comes from L2). One program per row left most of each program idle.
    block_k = min(triton.next_power_of_2(k), 512)
    block_m = max(1, 2048 // block_k)
    _quantize_rows_kernel[(triton.cdiv(m, block_m),)](
        rows, out, scale, m, k, QMAX=qmax, INV_QMAX=1.0 / qmax, MIN_AMAX=MIN_AMAX, ROUNDER=_ROUNDER,
        INTEGER=storage_dtype == torch.int8, HARDWARE_E4M3=x.is_cuda,
        BLOCK_M=block_m, BLOCK_K=block_k, NUM_CHUNKS=triton.cdiv(k, block_k), num_warps=4)
    return out, scale


def dequantize_int32(acc: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None,
                     dtype: torch.dtype) -> torch.Tensor:
    """acc int32 [M, N] (rows beyond ``x_scale``'s are dropped), x_scale float32 [M, 1], w_scale float32 [N],
    bias [N] or None -> (acc * x_scale * w_scale + bias) [M, N] in ``dtype``."""
    m, n = x_scale.shape[0], acc.shape[1]
    out = torch.empty((m, n), dtype=dtype, device=acc.device)
    if m == 0:
        return out
    block_n = min(triton.next_power_of_2(n), 1024)
    block_m = max(1, 4096 // block_n)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    _dequantize_int32_kernel[grid](acc, x_scale, w_scale, bias if bias is not None else w_scale, out, m, n,
                                   acc.stride(0), HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_N=block_n,
                                   num_warps=4)
    return out


if triton is not None:

    @triton.jit
    def _dequantize_int32_kernel(acc_ptr, xs_ptr, ws_ptr, bias_ptr, out_ptr, num_rows, num_cols, acc_stride,
                                 HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        inside = (rows < num_rows)[:, None] & (cols < num_cols)[None, :]
        acc = tl.load(acc_ptr + rows[:, None] * acc_stride + cols[None, :], mask=inside, other=0).to(tl.float32)
        xs = tl.load(xs_ptr + rows, mask=rows < num_rows, other=0.0)
        ws = tl.load(ws_ptr + cols, mask=cols < num_cols, other=0.0)
        y = acc * xs[:, None] * ws[None, :]
        if HAS_BIAS:
            y = y + tl.load(bias_ptr + cols, mask=cols < num_cols, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptr + rows[:, None] * num_cols + cols[None, :], y.to(out_ptr.dtype.element_ty), mask=inside)

    @triton.jit
    def _quantize_rows_kernel(x_ptr, out_ptr, scale_ptr, num_rows, dim, QMAX: tl.constexpr, INV_QMAX: tl.constexpr,
                              MIN_AMAX: tl.constexpr, ROUNDER: tl.constexpr,
                              INTEGER: tl.constexpr, HARDWARE_E4M3: tl.constexpr, BLOCK_M: tl.constexpr,
                              BLOCK_K: tl.constexpr, NUM_CHUNKS: tl.constexpr):
        rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
        live = rows < num_rows
        cols = tl.arange(0, BLOCK_K)
        amax = tl.zeros((BLOCK_M,), dtype=tl.float32)
        for chunk in tl.static_range(NUM_CHUNKS):
            c = chunk * BLOCK_K + cols
            inside = live[:, None] & (c < dim)[None, :]
            x = tl.load(x_ptr + rows[:, None] * dim + c[None, :], mask=inside, other=0.0).to(tl.float32)
            amax = tl.maximum(amax, tl.max(tl.abs(x), axis=1))
        # The constants are constexpr: torch.compile's launcher would pass a float argument as float64. (Nothing
        # folds (x + R) - R away: Triton sets no reassociation flags; the CUDA test's ties would show it.)
        scale = tl.maximum(amax, MIN_AMAX) * INV_QMAX
        tl.store(scale_ptr + rows, scale, mask=live)
        inverse = tl.math.div_rn(1.0, scale)  # correctly rounded, as torch's reciprocal (Triton's "/" is not)
        for chunk in tl.static_range(NUM_CHUNKS):
            c = chunk * BLOCK_K + cols
            inside = live[:, None] & (c < dim)[None, :]
            x = tl.load(x_ptr + rows[:, None] * dim + c[None, :], mask=inside, other=0.0).to(tl.float32)
            scaled = x * inverse[:, None]
            scaled = tl.minimum(tl.maximum(scaled, -QMAX), QMAX)
            if INTEGER:
                scaled = (scaled + ROUNDER) - ROUNDER
            elif not HARDWARE_E4M3:
                bits = scaled.to(tl.int32, bitcast=True)
                bits = (bits + 0x7FFFF + ((bits >> 20) & 1)) & -0x100000  # round to 3 mantissa bits, half to even
                normal = bits.to(tl.float32, bitcast=True)
                subnormal = ((scaled * 512.0 + ROUNDER) - ROUNDER) / 512.0
                scaled = tl.where(tl.abs(scaled) < 0.015625, subnormal, normal)
            tl.store(out_ptr + rows[:, None] * dim + c[None, :], scaled.to(out_ptr.dtype.element_ty), mask=inside)
