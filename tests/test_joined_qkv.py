"""A decoder's self-attention projects q, k and v through one GEMM over the three weights side by side
(``MultiHeadAttention.project_qkv_joined``): the same numbers as three GEMMs, on views of one output."""

from __future__ import annotations

import pytest
import torch

from oasr.layers import CachedSelfAttention
from oasr.layers.cache import FullContext
from oasr.quantization.apply import method_named


@pytest.mark.parametrize("k_bias", [False, True])
def test_joined_projection_equals_three(k_bias: bool) -> None:
    torch.manual_seed(0)
    attention = CachedSelfAttention(48, 4, k_bias=k_bias).eval()
    x = torch.randn(3, 5, 48)
    with torch.inference_mode():
        for got, want in zip(attention.project_qkv_joined(x), attention.project_qkv(x), strict=True):
            assert got.shape == want.shape == (3, 4, 5, 12)
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_the_joined_weight_follows_the_projections() -> None:
    """Loading other weights after a call makes the joined copy again."""
    torch.manual_seed(1)
    attention = CachedSelfAttention(32, 2).eval()
    x = torch.randn(2, 1, 32)
    attention.project_qkv_joined(x)
    other = CachedSelfAttention(32, 2).state_dict()
    attention.load_state_dict(other)
    for got, want in zip(attention.project_qkv_joined(x), attention.project_qkv(x), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_quantized_projections_keep_their_own_gemms() -> None:
    """A quantized q/k/v runs its method (one shared quantization), not a float copy of its weights."""
    torch.manual_seed(2)
    attention = CachedSelfAttention(32, 2).eval()
    method = method_named("int8")
    for proj in (attention.q_proj, attention.k_proj, attention.v_proj):
        q, scale = method.quantize_weight(proj.weight)
        proj.set_quantized(method.bind(torch.device("cpu"), tuple(q.shape)), q, scale)
    x = torch.randn(2, 3, 32)
    for got, want in zip(attention.project_qkv_joined(x), attention.project_qkv(x), strict=True):
        assert torch.equal(got, want)
    assert "_joined_qkv" not in attention.__dict__


def test_a_cached_decoder_step_attends_through_the_joined_projection() -> None:
    """forward_cached over a dense cache: the joined projection's views attend as separate projections do."""
    torch.manual_seed(3)
    attention = CachedSelfAttention(32, 4).eval()
    x = torch.randn(2, 6, 32)
    with torch.inference_mode():
        got = attention.forward_cached(x, FullContext(), 0)
        want = attention.project_out(torch.nn.functional.scaled_dot_product_attention(
            *attention.project_qkv(x), is_causal=True))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
