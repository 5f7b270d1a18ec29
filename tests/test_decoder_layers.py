"""The waist's decoder-only layers (RMSNorm, rotary positions, gated MLP, grouped-query attention) against
transformers' Qwen3 modules on the same weights, on CPU fp32; and a paged decode equals full context."""

from __future__ import annotations

import pytest
import torch
import transformers
from transformers.models.qwen3 import modeling_qwen3 as qwen3

from oasr.engine.kv_cache import PagedKVPool, paged_context
from oasr.layers import GatedMLP, GroupedQueryAttention, RMSNorm, RotaryEmbedding, apply_rotary
from oasr.layers.cache import FullContext
from oasr.models.base import DecoderSpec, PromptAudio

TOLERANCE = 1e-5


def qwen3_config() -> transformers.Qwen3Config:
    config = transformers.Qwen3Config(hidden_size=48, intermediate_size=96, num_attention_heads=4,
                                      num_key_value_heads=2, head_dim=16, rope_theta=1_000_000.0,
                                      rms_norm_eps=1e-6, num_hidden_layers=1, vocab_size=32)
    config._attn_implementation = "eager"
    return config


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_equals_qwen3_rms_norm(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    theirs = qwen3.Qwen3RMSNorm(48, eps=1e-6)
    ours = RMSNorm(48, eps=1e-6)
    with torch.no_grad():
        theirs.weight.normal_(1.0, 0.3)
        ours.weight.copy_(theirs.weight)
    x = (3 * torch.randn(2, 5, 48)).to(dtype)
    assert torch.equal(ours.to(dtype)(x), theirs.to(dtype)(x))


def test_rotary_equals_qwen3_rotary_at_any_position() -> None:
    config = qwen3_config()
    positions = torch.tensor([[0, 1, 2, 700], [5, 6, 7, 8]])
    cos_ref, sin_ref = qwen3.Qwen3RotaryEmbedding(config)(torch.zeros(1), positions)
    cos, sin = RotaryEmbedding(16, 1_000_000.0)(positions)
    assert (cos[:, 0] - cos_ref).abs().max() < TOLERANCE and (sin[:, 0] - sin_ref).abs().max() < TOLERANCE
    q, k = torch.randn(2, 4, 4, 16), torch.randn(2, 2, 4, 16)
    q_ref, k_ref = qwen3.apply_rotary_pos_emb(q, k, cos_ref, sin_ref)
    assert (apply_rotary(q, cos, sin) - q_ref).abs().max() < TOLERANCE
    assert (apply_rotary(k, cos, sin) - k_ref).abs().max() < TOLERANCE


def test_gated_mlp_equals_qwen3_mlp() -> None:
    torch.manual_seed(1)
    theirs = qwen3.Qwen3MLP(qwen3_config())
    ours = GatedMLP(48, 96, "silu")
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(2, 5, 48)
    assert (ours(x) - theirs(x)).abs().max() < TOLERANCE


@torch.no_grad()
def test_grouped_query_attention_equals_qwen3_attention() -> None:
    torch.manual_seed(2)
    config = qwen3_config()
    theirs = qwen3.Qwen3Attention(config, layer_idx=0).eval()
    for p in theirs.parameters():
        p.normal_(0.0, 0.3)
    ours = GroupedQueryAttention(48, 4, 2, 16, qk_norm_eps=1e-6)
    ours.load_state_dict(theirs.state_dict())  # the same key names
    x = torch.randn(2, 7, 48)
    positions = torch.arange(7).expand(2, -1)
    cos, sin = qwen3.Qwen3RotaryEmbedding(config)(x, positions)
    causal = torch.full((7, 7), float("-inf")).triu(1)[None, None]
    expected, _ = theirs(x, (cos, sin), attention_mask=causal)
    got = ours.forward_cached(x, RotaryEmbedding(16, 1_000_000.0)(positions), FullContext(), 0)
    assert (got - expected).abs().max() < TOLERANCE
    assert expected.std() > 0.1


@torch.no_grad()
def test_grouped_query_attention_through_the_paged_pool_equals_full_context() -> None:
    """The pool holds the key/value heads only (2 for 4 query heads); a prompt then single steps, in blocks of 4
    positions scattered over the pool, give the full-context outputs."""
    torch.manual_seed(3)
    attention = GroupedQueryAttention(48, 4, 2, 16, qk_norm_eps=1e-6)
    rotary = RotaryEmbedding(16)
    spec = DecoderSpec(1, 4, 2, 16, 16, cross=None, prompt_audio=PromptAudio(8))
    pool = PagedKVPool(spec, num_blocks=8, block_size=4, fmt=torch.float32, device=torch.device("cpu"))
    table = torch.tensor([[5, 2], [3, 7]])
    x = torch.randn(2, 7, 48)
    positions = torch.arange(7).expand(2, -1)
    full = attention.forward_cached(x, rotary(positions), FullContext(), 0)
    steps = [attention.forward_cached(x[:, :5], rotary(positions[:, :5]),
                                      paged_context(pool, table, positions[:, :5]), 0)]
    for t in (5, 6):
        p = positions[:, t : t + 1]
        steps.append(attention.forward_cached(x[:, t : t + 1], rotary(p), paged_context(pool, table, p), 0))
    assert (torch.cat(steps, dim=1) - full).abs().max() < TOLERANCE
