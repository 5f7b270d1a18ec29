"""The relative-position mask kernel against its torch reference (interpreter on CPU, native on CUDA), and the
attention module's kernel path against its torch path."""

from __future__ import annotations

import pytest
import torch

from oasr.kernels.rel_position import position_mask_reference
from oasr.layers import apply_backend
from oasr.layers.rel_attention import RelPositionMultiHeadAttention, relative_position_embeddings
from test_kernels import worst_error_interpreted

pytest.importorskip("triton")

_INTERPRETED = """
import torch
from oasr.kernels.rel_position import position_mask, position_mask_reference, supported
torch.manual_seed(0)
worst = 0.0
# Frames below, at and past the 16-query and 128-key tiles; a row with no real key; widths with spare slots.
for b, h, t in [(3, 2, 5), (2, 3, 37), (1, 1, 130)]:
    width = -(-(2 * t - 1) // 8) * 8
    scores = torch.randn(h, b * t, width)
    bias = torch.randn(h, width)
    key_mask = torch.arange(t)[None] < torch.tensor([t, t // 2, 0][:b])[:, None]
    assert supported(scores)
    got = position_mask(scores, bias, key_mask)
    want = position_mask_reference(scores, bias, key_mask)
    assert got.shape == want.shape == (b, h, t, t) and got.stride(2) % 8 == 0
    worst = max(worst, (got - want).abs().max().item())
print(worst)
"""


def test_position_mask_kernel_equals_its_reference_in_the_interpreter() -> None:
    assert worst_error_interpreted(_INTERPRETED) < 1e-6


def test_reference_is_the_shifted_biased_masked_product() -> None:
    """Element by element: key j of query i reads slot T-1-i+j; padded keys get the floor."""
    torch.manual_seed(1)
    b, h, t = 2, 2, 4
    width = 8
    scores, bias = torch.randn(h, b * t, width), torch.randn(h, width)
    key_mask = torch.tensor([[True] * 4, [True, True, False, False]])
    out = position_mask_reference(scores, bias, key_mask)
    floor = torch.finfo(torch.float32).min
    for row in range(b):
        for head in range(h):
            for i in range(t):
                for j in range(t):
                    slot = t - 1 - i + j
                    want = scores[head, row * t + i, slot] + bias[head, slot] if key_mask[row, j] else floor
                    assert out[row, head, i, j].item() == pytest.approx(float(want), rel=1e-6)


def attention_pair(seed: int = 0) -> RelPositionMultiHeadAttention:
    torch.manual_seed(seed)
    module = RelPositionMultiHeadAttention(32, 4).eval()
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0.0, 0.3)
    return module


def test_kernel_path_equals_the_torch_path_on_the_real_queries() -> None:
    """On CPU the kernel path runs the reference: this pins the rearranged arithmetic (q with u in the multiply,
    v - u as a per-slot bias) to the torch path's (q + v - u in the multiply)."""
    module = attention_pair()
    x = torch.randn(3, 11, 32)
    lengths = torch.tensor([11, 6, 1])
    key_mask = torch.arange(11)[None] < lengths[:, None]
    positions = relative_position_embeddings(11, 32, device=x.device, dtype=x.dtype)
    with torch.inference_mode():
        expected = module(x, positions, key_mask)
        apply_backend(module, "kernels")
        assert module.use_kernel
        got = module(x, positions, key_mask)
        unmasked = module(x, positions)
        apply_backend(module, "torch")
        unmasked_torch = module(x, positions)
    torch.testing.assert_close(got[key_mask], expected[key_mask], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(unmasked, unmasked_torch, atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_position_mask_kernel_equals_its_reference_on_cuda(dtype: torch.dtype) -> None:
    from oasr.kernels.rel_position import position_mask

    torch.manual_seed(0)
    b, h, t = 4, 8, 203
    width = -(-(2 * t - 1) // 8) * 8
    scores = torch.randn(h, b * t, width, device="cuda", dtype=dtype)
    bias = torch.randn(h, width, device="cuda")
    key_mask = torch.arange(t, device="cuda")[None] < torch.randint(1, t + 1, (b,), device="cuda")[:, None]
    got = position_mask(scores, bias, key_mask)
    want = position_mask_reference(scores, bias, key_mask)
    assert got.dtype == dtype and torch.equal(got, want)
