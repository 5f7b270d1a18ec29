"""The Qwen3 language model of Qwen3-ASR, module for module in transformers' key layout
(``model.language_model.layers.0.self_attn.q_norm`` ...).

Pre-norm (RMSNorm) blocks of grouped-query self-attention, with per-head q/k RMSNorm and rotary positions, and a
gated SiLU feed-forward. It reads embeddings, not tokens (``forward``), so a prompt's audio positions can carry
the encoder's output; self-attention goes through a ``SelfAttentionCache``, so the same module serves teacher
forcing (``FullContext``) and the engine's paged pool.
"""

from __future__ import annotations

import torch
from torch import nn

from oasr.layers import Embedding, GatedMLP, GroupedQueryAttention, RMSNorm, RotaryEmbedding
from oasr.layers.cache import SelfAttentionCache
from oasr.models.qwen3_asr.config import Qwen3TextConfig


class Qwen3DecoderLayer(nn.Module):
    def __init__(self, config: Qwen3TextConfig) -> None:
        super().__init__()
        d = config.hidden_size
        self.self_attn = GroupedQueryAttention(d, config.num_attention_heads, config.num_key_value_heads,
                                               config.head_dim, bias=config.attention_bias,
                                               qk_norm_eps=config.rms_norm_eps)
        self.mlp = GatedMLP(d, config.intermediate_size, config.hidden_act)
        self.input_layernorm = RMSNorm(d, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(d, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, delta: torch.Tensor | None, rotary: tuple[torch.Tensor, torch.Tensor],
                cache: SelfAttentionCache, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """x: [B, T, d] the residual stream; ``delta``: what the layer before adds to it (None before the first
        layer); ``index``: this layer's slot in the cache -> (the stream before this layer's feed-forward output,
        that output): each residual add happens inside the norm after it (``RMSNorm.add_forward``)."""
        x, h = self.input_layernorm.add_forward(x, delta)
        x, h = self.post_attention_layernorm.add_forward(x, self.self_attn.forward_cached(h, rotary, cache, index))
        return x, self.mlp(h)


class Qwen3TextModel(nn.Module):
    def __init__(self, config: Qwen3TextConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Qwen3DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config.head_dim, config.rope_theta)

    def forward(self, embeds: torch.Tensor, positions: torch.Tensor, cache: SelfAttentionCache) -> torch.Tensor:
        """embeds: [B, T, d]; positions: [B, T] -> hidden states [B, T, d] (after the final norm)."""
        rotary = self.rotary_emb(positions)
        x, delta = embeds, None
        for index, layer in enumerate(self.layers):
            x, delta = layer(x, delta, rotary, cache, index)
        return self.norm.add_forward(x, delta)[1]
