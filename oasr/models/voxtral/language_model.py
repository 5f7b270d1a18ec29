"""The Llama-layout decoder of the speech LLMs (Voxtral's Mistral, Qwen2-Audio's Qwen2, Granite Speech's Granite),
module for module in transformers' key layout (``language_model.layers.0.self_attn.q_proj`` ...).

Pre-norm (RMSNorm) blocks of grouped-query self-attention with rotary positions and a gated feed-forward, as
``oasr.models.qwen3_asr.language_model`` without Qwen3's per-head q/k norms. ``qkv_bias``: Qwen2 gives its query,
key and value projections a bias, but not its output projection; Llama/Mistral give none. The model reads
embeddings (``forward``), so a prompt's audio positions can carry the encoder's output, and attends through a
``SelfAttentionCache`` (``FullContext`` for teacher forcing, the engine's paged pool when serving).

Granite scales four things Llama leaves at one: the input embeddings (``embedding_multiplier``), every residual
branch (``residual_multiplier``), the attention logits (``attention_multiplier`` in place of ``1 / sqrt(head_dim)``,
applied to the queries, so the caches' attention stays the plain one) and the logits (``logits_scaling``, kept in
the config; whether a head divides by it is the family's choice).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from oasr.layers import Embedding, GatedMLP, GroupedQueryAttention, Linear, RMSNorm, RotaryEmbedding
from oasr.layers.cache import SelfAttentionCache
from oasr.models.fastconformer.config import _known_fields


@dataclass(frozen=True)
class TextConfig:
    """A Llama / Mistral / Qwen2 ``text_config``, field for field as transformers writes it."""

    vocab_size: int = 131_072
    hidden_size: int = 3072
    intermediate_size: int = 8192
    num_hidden_layers: int = 30
    num_attention_heads: int = 32
    num_key_value_heads: int = 8
    head_dim: int = 128
    hidden_act: str = "silu"
    max_position_embeddings: int = 131_072
    rms_norm_eps: float = 1e-5
    rope_theta: float = 100_000_000.0
    tie_word_embeddings: bool = False
    qkv_bias: bool = False  # not a transformers field: Qwen2's layout (set by the family's config, not the file)
    embedding_multiplier: float = 1.0  # Granite's four scales (1.0 / None: Llama's)
    residual_multiplier: float = 1.0
    attention_multiplier: float | None = None
    logits_scaling: float = 1.0
    model_type: str = "llama"

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"{self.num_attention_heads} heads cannot share {self.num_key_value_heads} key/value "
                             "heads evenly")

    @classmethod
    def from_dict(cls, values: dict[str, Any], **overrides: Any) -> TextConfig:
        """transformers 5 keeps the rotary settings in ``rope_parameters``, earlier versions ``rope_theta`` at the
        top level. Only the default rotation is served; a scaled one (``rope_type`` llama3, yarn ...) and sliding
        windows are refused, naming the field."""
        rope = values.get("rope_parameters") or values.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise ValueError(f"rotary embeddings of type {rope_type!r} are not supported (only 'default')")
        # Qwen2 writes a sliding_window it does not use unless use_sliding_window; Mistral uses any it writes.
        windowed = values.get("use_sliding_window") or (values.get("model_type") == "mistral"
                                                        and values.get("sliding_window") is not None)
        if windowed:
            raise ValueError("sliding-window attention (sliding_window) is not supported")
        if values.get("attention_bias") or values.get("mlp_bias"):
            raise ValueError("attention_bias / mlp_bias are not supported in this language model")
        kwargs = _known_fields(cls, {**values, **overrides})
        theta = rope.get("rope_theta", values.get("rope_theta"))
        if theta is not None:
            kwargs["rope_theta"] = float(theta)
        if kwargs.get("head_dim") is None:
            hidden = kwargs.get("hidden_size", cls.hidden_size)
            kwargs["head_dim"] = hidden // kwargs.get("num_attention_heads", cls.num_attention_heads)
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        values = dataclasses.asdict(self)
        values.pop("qkv_bias")
        for name, plain in (("embedding_multiplier", 1.0), ("residual_multiplier", 1.0),
                            ("attention_multiplier", None), ("logits_scaling", 1.0)):
            if values[name] == plain:  # written for Granite only: Llama's and Qwen2's configs have no such fields
                values.pop(name)
        values["rope_parameters"] = {"rope_theta": values.pop("rope_theta"), "rope_type": "default"}
        return values


class ScaledQueryAttention(GroupedQueryAttention):
    """Grouped-query attention whose logits are scaled by ``scale`` instead of ``1 / sqrt(head_dim)``: the queries
    are multiplied by ``scale * sqrt(head_dim)`` before the rotation (a linear map, so the order does not matter)."""

    def __init__(self, *args, scale: float, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.query_scale = scale * self.head_dim**0.5

    def _heads(self, x, proj, num_heads, norm):
        heads = super()._heads(x, proj, num_heads, norm)
        return heads * self.query_scale if proj is self.q_proj else heads


class DecoderLayer(nn.Module):
    def __init__(self, config: TextConfig) -> None:
        super().__init__()
        d = config.hidden_size
        heads = (config.num_attention_heads, config.num_key_value_heads, config.head_dim)
        if config.attention_multiplier is None:
            self.self_attn = GroupedQueryAttention(d, *heads, bias=config.qkv_bias)
        else:
            self.self_attn = ScaledQueryAttention(d, *heads, bias=config.qkv_bias, scale=config.attention_multiplier)
        self.residual = config.residual_multiplier
        if config.qkv_bias:  # Qwen2: biases on q, k and v only
            self.self_attn.o_proj = Linear(config.num_attention_heads * config.head_dim, d, bias=False)
        self.mlp = GatedMLP(d, config.intermediate_size, config.hidden_act)
        self.input_layernorm = RMSNorm(d, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(d, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, delta: torch.Tensor | None, rotary: tuple[torch.Tensor, torch.Tensor],
                cache: SelfAttentionCache, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """x: [B, T, d] the residual stream; ``delta``: what the layer before adds to it (None before the first
        layer) -> (the stream before this layer's feed-forward output, that output): each residual add happens
        inside the norm after it (``RMSNorm.add_forward``)."""
        x, h = self.input_layernorm.add_forward(x, delta)
        attended = self.self_attn.forward_cached(h, rotary, cache, index)
        if self.residual != 1.0:
            attended = attended * self.residual
        x, h = self.post_attention_layernorm.add_forward(x, attended)
        out = self.mlp(h)
        return x, out if self.residual == 1.0 else out * self.residual


class TextModel(nn.Module):
    def __init__(self, config: TextConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config.head_dim, config.rope_theta)

    def forward(self, embeds: torch.Tensor, positions: torch.Tensor, cache: SelfAttentionCache) -> torch.Tensor:
        """embeds: [B, T, d]; positions: [B, T] -> hidden states [B, T, d] (after the final norm)."""
        rotary = self.rotary_emb(positions)
        scale = self.config.embedding_multiplier
        x, delta = (embeds if scale == 1.0 else embeds * scale), None
        for index, layer in enumerate(self.layers):
            x, delta = layer(x, delta, rotary, cache, index)
        return self.norm.add_forward(x, delta)[1]
