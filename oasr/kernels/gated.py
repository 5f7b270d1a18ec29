"""A gated feed-forward block's gate in one pass: ``silu(gate) * up`` (SwiGLU, Llama and Qwen decoders).

In torch the gate is two passes over [rows, intermediate] tensors (the SiLU writes its output, the product reads
it back with ``up``); here each element is read once from each input and written once. The SiLU is computed in
float32 and rounded to the inputs' dtype before the product, as torch rounds its two passes.

``silu_mul_reference`` is the torch path; it serves where Triton cannot run and in the equivalence tests.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from oasr.kernels.runtime import triton_runs_on

try:
    import triton
    import triton.language as tl
except ImportError:  # the torch reference serves
    triton = None

BLOCK = 2048


def silu_mul_reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


def supported(x: torch.Tensor) -> bool:
    return triton_runs_on(x)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu_mul_reference`` in one kernel where ``supported`` (and both inputs share shape and dtype)."""
    if not supported(gate) or gate.shape != up.shape or gate.dtype != up.dtype:
        return silu_mul_reference(gate, up)
    gate, up = gate.contiguous(), up.contiguous()
    out = torch.empty_like(gate)
    n = gate.numel()
    _silu_mul_kernel[(triton.cdiv(n, BLOCK),)](gate, up, out, n, BLOCK=BLOCK, num_warps=4)
    return out


if triton is not None:

    @triton.jit
    def _silu_mul_kernel(gate_ptr, up_ptr, out_ptr, n, BLOCK: tl.constexpr):
        at = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        live = at < n
        g = tl.load(gate_ptr + at, mask=live, other=0.0).to(tl.float32)
        up = tl.load(up_ptr + at, mask=live, other=0.0)
        silu = (g / (1.0 + tl.exp(-g))).to(up.dtype)  # rounded as torch's SiLU pass writes it
        tl.store(out_ptr + at, (silu.to(tl.float32) * up.to(tl.float32)).to(up.dtype), mask=live)
