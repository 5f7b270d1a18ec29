"""The gated MLP's one-pass SiLU gate: the Triton kernel against torch's two passes (interpreter on CPU, native on
CUDA), and the kernels backend switching a Qwen3 decoder's MLP to it."""

from __future__ import annotations

import textwrap

import pytest
import torch

from oasr.layers import GatedMLP, apply_backend
from test_kernels import worst_error_interpreted

_INTERPRETED = textwrap.dedent("""
    import torch
    from oasr.kernels.gated import BLOCK, silu_mul, silu_mul_reference, supported
    torch.manual_seed(0)
    worst = 0.0
    # Fewer elements than a block, a whole number of blocks, a ragged last block; a strided input.
    for shape in [(3, 5), (2, BLOCK), (7, 333), (4, 3, 129)]:
        gate, up = torch.randn(shape) * 4, torch.randn(shape)
        assert supported(gate)
        worst = max(worst, (silu_mul(gate, up) - silu_mul_reference(gate, up)).abs().max().item())
    gate = torch.randn(64, 20).t()
    up = torch.randn(20, 64)
    worst = max(worst, (silu_mul(gate, up) - silu_mul_reference(gate, up)).abs().max().item())
    print(worst)
""")


def test_silu_mul_kernel_equals_its_reference_in_the_interpreter() -> None:
    assert worst_error_interpreted(_INTERPRETED) < 1e-5


def test_kernels_backend_runs_a_silu_gate_through_the_kernel_and_counts_silu_as_covered() -> None:
    mlp = GatedMLP(16, 40, "silu")
    gaps = {g.op for g in apply_backend(mlp, "kernels")}
    assert mlp.use_kernel and "silu" not in gaps and "linear" in gaps
    assert not apply_backend(mlp, "torch") and not mlp.use_kernel
    gelu = GatedMLP(16, 40, "gelu")
    assert "gelu" in {g.op for g in apply_backend(gelu, "kernels")}  # only a SiLU gate has the kernel


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_silu_mul_kernel_equals_its_reference_on_cuda(dtype: torch.dtype) -> None:
    from oasr.kernels.gated import silu_mul, silu_mul_reference

    torch.manual_seed(0)
    gate = (torch.randn(300, 6144, device="cuda") * 4).to(dtype)
    up = torch.randn(300, 6144, device="cuda").to(dtype)
    got, want = silu_mul(gate, up), silu_mul_reference(gate, up)
    assert got.dtype == dtype
    # One rounding of the SiLU and one of the product, as torch's: at most a unit in the last place apart.
    ulp = {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}[dtype]
    assert ((got.float() - want.float()).abs() <= ulp * want.float().abs().clamp(min=1)).all()
