"""RMSNorm kernels against their torch references: the residual add + norm and the per-head norm + rotation, under
Triton's interpreter on CPU and natively on CUDA; and the references against the layers' own torch paths."""

from __future__ import annotations

import textwrap

import pytest
import torch

from oasr.kernels.rms_norm import add_rms_norm, add_rms_norm_reference, rms_norm_rotary, rms_norm_rotary_reference
from oasr.layers import RMSNorm, RotaryEmbedding
from oasr.layers.rotary import apply_rotary
from test_kernels import worst_error_interpreted

_INTERPRETED = textwrap.dedent("""
    import torch
    from oasr.kernels.rms_norm import (add_rms_norm, add_rms_norm_reference, rms_norm_rotary,
                                       rms_norm_rotary_reference)
    from oasr.layers import RotaryEmbedding
    torch.manual_seed(0)
    worst = 0.0
    # Widths that are and are not powers of two; with and without the residual add.
    for rows, dim in [(5, 48), (3, 64), (2, 100)]:
        x, delta, w = 3 * torch.randn(rows, dim), torch.randn(rows, dim), torch.randn(dim)
        for d in (None, delta):
            got, want = add_rms_norm(x, d, w, 1e-6), add_rms_norm_reference(x, d, w, 1e-6)
            worst = max(worst, *((g - r).abs().max().item() for g, r in zip(got, want)))
    # Heads of 16 and 64; one token per row (a decode step) and several; positions that differ per row.
    for b, t, h, d in [(2, 3, 4, 16), (3, 1, 2, 64)]:
        x, w = 3 * torch.randn(b, t, h, d), torch.randn(d)
        positions = torch.arange(t)[None] + torch.tensor([0, 7, 30])[:b, None]
        cos, sin = RotaryEmbedding(d, 1_000_000.0)(positions)
        got = rms_norm_rotary(x, w, 1e-6, cos, sin)
        worst = max(worst, (got - rms_norm_rotary_reference(x, w, 1e-6, cos, sin)).abs().max().item())
    print(worst)
""")


def test_rms_norm_kernels_equal_their_references_in_the_interpreter() -> None:
    assert worst_error_interpreted(_INTERPRETED) < 1e-5


def test_the_references_are_the_layers_torch_paths() -> None:
    """What the kernels are checked against is what the torch backend computes: RMSNorm after a residual add,
    and a head's norm then ``apply_rotary`` (fp16, so the rounding points count too)."""
    torch.manual_seed(1)
    norm = RMSNorm(32, 1e-6).half()
    with torch.no_grad():
        norm.weight.normal_()
    x, delta = torch.randn(4, 5, 32).half(), torch.randn(4, 5, 32).half()
    s, h = norm.add_forward(x, delta)
    assert torch.equal(s, x + delta) and torch.equal(h, norm(x + delta))
    assert torch.equal(add_rms_norm_reference(x, delta, norm.weight, 1e-6)[1], h)
    heads = torch.randn(2, 3, 4, 32).half()
    cos, sin = RotaryEmbedding(32)(torch.arange(3).expand(2, -1))
    want = apply_rotary(norm(heads).transpose(1, 2), cos, sin)
    assert torch.equal(rms_norm_rotary_reference(heads, norm.weight, 1e-6, cos, sin), want)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_rms_norm_kernels_equal_their_references_on_cuda(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    tolerance = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}[dtype]
    x, delta = (torch.randn(300, 2048, device="cuda", dtype=dtype) for _ in range(2))
    w = torch.randn(2048, device="cuda", dtype=dtype)
    for d in (None, delta):
        for got, want in zip(add_rms_norm(x, d, w, 1e-6), add_rms_norm_reference(x, d, w, 1e-6)):
            assert (got.float() - want.float()).abs().max().item() <= tolerance * max(1.0, want.abs().max().item())
    heads, w = torch.randn(8, 37, 16, 128, device="cuda", dtype=dtype), torch.randn(128, device="cuda", dtype=dtype)
    cos, sin = RotaryEmbedding(128, 1_000_000.0).cuda()(torch.randint(0, 4000, (8, 37), device="cuda"))
    got = rms_norm_rotary(heads, w, 1e-6, cos, sin)
    want = rms_norm_rotary_reference(heads, w, 1e-6, cos, sin)
    assert got.shape == want.shape and got.is_contiguous()
    assert (got.float() - want.float()).abs().max().item() <= tolerance * max(1.0, want.abs().max().item())
