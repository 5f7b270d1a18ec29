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


def test_a_pair_mask_hides_the_keys_outside_each_querys_window_on_both_paths() -> None:
    """A band of two frames either side: query 0 reads keys 0..2 only, so frames 3.. change nothing there."""
    module = attention_pair(1)
    x = torch.randn(2, 9, 32)
    key_mask = torch.arange(9)[None] < torch.tensor([9, 5])[:, None]
    band = torch.ones(9, 9, dtype=torch.bool).triu(-2).tril(2)
    positions = relative_position_embeddings(9, 32, device=x.device, dtype=x.dtype)
    moved = x.clone()
    moved[:, 3:] += torch.randn(2, 6, 32)
    outputs = {}
    with torch.inference_mode():
        for backend in ("torch", "kernels"):
            apply_backend(module, backend)
            outputs[backend] = [module(v, positions, key_mask, pair_mask=band) for v in (x, moved)]
        apply_backend(module, "torch")
        unlimited = module(x, positions, key_mask)
    for window, window_moved in outputs.values():
        torch.testing.assert_close(window_moved[:, 0], window[:, 0], atol=1e-5, rtol=1e-5)
        assert not torch.allclose(window_moved[:, 3], window[:, 3])
    torch.testing.assert_close(outputs["kernels"][0][key_mask], outputs["torch"][0][key_mask], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(unlimited[:, 0], outputs["torch"][0][:, 0])  # the band did limit query 0


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
