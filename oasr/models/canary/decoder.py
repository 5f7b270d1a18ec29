"""The transformer decoder Canary and Cohere Transcribe share, module for module in transformers' key layout
(``model.decoder.layers.0.encoder_attn.q_proj`` ...), after the renames of ``oasr.models.converters.huggingface``.

Pre-LN blocks: self-attention, cross-attention, feed-forward, each on a LayerNorm of the residual stream. The input
is the token embedding plus a position embedding, normalised (``embedding_layernorm``). Self-attention goes through a
``SelfAttentionCache`` and cross-attention through a ``CrossAttentionCache``, so the same module serves teacher
forcing (``FullContext``/``DenseCross``) and the engine's paged pools.
"""

from __future__ import annotations

import torch
from torch import nn

from oasr.layers import CachedSelfAttention, Embedding, LayerNorm, Linear, SinusoidalPositions, activation
from oasr.layers.attention import CrossAttention
from oasr.layers.cache import CrossAttentionCache, SelfAttentionCache
from oasr.models.canary.config import AEDDecoderConfig


class DecoderMLP(nn.Module):
    def __init__(self, config: AEDDecoderConfig) -> None:
        super().__init__()
        self.fc1 = Linear(config.hidden_size, config.intermediate_size)
        self.fc2 = Linear(config.intermediate_size, config.hidden_size)
        self.act = activation(config.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2.after(self.act, self.fc1(x))


class AEDDecoderLayer(nn.Module):
    def __init__(self, config: AEDDecoderConfig) -> None:
        super().__init__()
        d, heads = config.hidden_size, config.num_attention_heads
        self.self_attn = CachedSelfAttention(d, heads, k_bias=True)
        self.encoder_attn = CrossAttention(d, heads, k_bias=True)
        self.mlp = DecoderMLP(config)
        self.input_layernorm = LayerNorm(d)
        self.post_attention_layernorm = LayerNorm(d)
        self.final_layernorm = LayerNorm(d)

    def forward(
        self, x: torch.Tensor, cache: SelfAttentionCache, cross: CrossAttentionCache, index: int
    ) -> torch.Tensor:
        """x: [B, T, d] -> [B, T, d]; ``index``: this layer's slot in both caches."""
        x = x + self.self_attn.forward_cached(self.input_layernorm(x), cache, index)
        x = x + self.encoder_attn.forward_cross(self.post_attention_layernorm(x), cross, index)
        return x + self.mlp(self.final_layernorm(x))


class AEDDecoder(nn.Module):
    def __init__(self, config: AEDDecoderConfig) -> None:
        super().__init__()
        d = config.hidden_size
        self.config = config
        self.embed_tokens = Embedding(config.vocab_size, d)
        if config.positions == "learned":
            self.pos_emb: nn.Module = Embedding(config.max_position_embeddings, d)
        else:
            self.pos_emb = SinusoidalPositions(config.max_position_embeddings, d)
        self.embedding_layernorm = LayerNorm(d)
        self.layers = nn.ModuleList(AEDDecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = LayerNorm(d)
        # transformers keeps the encoder-to-decoder projection in the decoder (it projects the encoder states on
        # every decoder call); here it runs once, in ``encode``.
        if config.encoder_hidden_size is not None:
            self.proj = Linear(config.encoder_hidden_size, d)

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cache: SelfAttentionCache,
        cross: CrossAttentionCache,
    ) -> torch.Tensor:
        """tokens, positions: [B, T] -> hidden states [B, T, d] (after the final norm)."""
        x = self.embed_tokens(tokens)
        x = self.embedding_layernorm(x + self.pos_emb(positions).to(x.dtype))
        for index, layer in enumerate(self.layers):
            x = layer(x, cache, cross, index)
        return self.norm(x)
