"""Whisper, module for module in the Hugging Face key layout (``model.encoder.layers.0.self_attn.q_proj`` ...).

The decoder runs incrementally against a preallocated cache: self-attention K/V for up to
``max_target_positions`` tokens and cross-attention K/V computed once from the encoder output.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from oasr.layers import GELU, Conv1d, Embedding, LayerNorm, Linear, MultiHeadAttention
from oasr.models import ARCHITECTURES
from oasr.models.whisper.config import WhisperConfig, tiny_whisper_config


@dataclass
class WhisperKVCache:
    """Per-batch decoder state. Tensors are [layers, batch, heads, positions, head_dim]."""

    self_k: torch.Tensor
    self_v: torch.Tensor
    cross_k: torch.Tensor
    cross_v: torch.Tensor

    @property
    def max_positions(self) -> int:
        return self.self_k.shape[3]



class WhisperEncoderLayer(nn.Module):
    def __init__(self, config: WhisperConfig) -> None:
        super().__init__()
        d = config.d_model
        self.self_attn = MultiHeadAttention(d, config.encoder_attention_heads)
        self.self_attn_layer_norm = LayerNorm(d)
        self.fc1 = Linear(d, config.encoder_ffn_dim)
        self.fc2 = Linear(config.encoder_ffn_dim, d)
        self.final_layer_norm = LayerNorm(d)
        self.act = GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.self_attn_layer_norm(x))
        return x + self.fc2(self.act(self.fc1(self.final_layer_norm(x))))


class WhisperEncoder(nn.Module):
    def __init__(self, config: WhisperConfig) -> None:
        super().__init__()
        d = config.d_model
        self.conv1 = Conv1d(config.num_mel_bins, d, kernel_size=3, padding=1)
        self.conv2 = Conv1d(d, d, kernel_size=3, stride=2, padding=1)
        self.embed_positions = Embedding(config.max_source_positions, d)
        self.layers = nn.ModuleList(WhisperEncoderLayer(config) for _ in range(config.encoder_layers))
        self.layer_norm = LayerNorm(d)
        self.act = GELU()

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """features: [B, n_mels, 2 * max_source_positions] -> hidden states [B, max_source_positions, d_model]."""
        x = self.act(self.conv2(self.act(self.conv1(features)))).transpose(1, 2)
        if x.shape[1] != self.embed_positions.num_embeddings:
            raise ValueError(
                f"Whisper's encoder takes {2 * self.embed_positions.num_embeddings} feature frames, got {features.shape[-1]}"
            )
        x = x + self.embed_positions.weight.to(x.dtype)
        for layer in self.layers:
            x = layer(x)
        return self.layer_norm(x)


def _causal_mask(num_new: int, offset: int, device: torch.device) -> torch.Tensor | None:
    """Bool [1, 1, num_new, offset + num_new]: new token i sees cached positions <= offset + i."""
    if num_new == 1:
        return None
    rows = torch.arange(num_new, device=device)[:, None] + offset
    cols = torch.arange(offset + num_new, device=device)[None, :]
    return (cols <= rows)[None, None]


class WhisperDecoderLayer(nn.Module):
    def __init__(self, config: WhisperConfig) -> None:
        super().__init__()
        d = config.d_model
        self.self_attn = MultiHeadAttention(d, config.decoder_attention_heads)
        self.self_attn_layer_norm = LayerNorm(d)
        self.encoder_attn = MultiHeadAttention(d, config.decoder_attention_heads)
        self.encoder_attn_layer_norm = LayerNorm(d)
        self.fc1 = Linear(d, config.decoder_ffn_dim)
        self.fc2 = Linear(config.decoder_ffn_dim, d)
        self.final_layer_norm = LayerNorm(d)
        self.act = GELU()

    def forward(
        self, x: torch.Tensor, cache: WhisperKVCache, index: int, offset: int, mask: torch.Tensor | None
    ) -> torch.Tensor:
        end = offset + x.shape[1]
        h = self.self_attn_layer_norm(x)
        k, v = self.self_attn.project_kv(h)
        cache.self_k[index, :, :, offset:end] = k
        cache.self_v[index, :, :, offset:end] = v
        x = x + self.self_attn.attend(h, cache.self_k[index, :, :, :end], cache.self_v[index, :, :, :end], mask=mask)
        h = self.encoder_attn_layer_norm(x)
        x = x + self.encoder_attn.attend(h, cache.cross_k[index], cache.cross_v[index])
        return x + self.fc2(self.act(self.fc1(self.final_layer_norm(x))))


class WhisperDecoder(nn.Module):
    def __init__(self, config: WhisperConfig) -> None:
        super().__init__()
        d = config.d_model
        self.embed_tokens = Embedding(config.vocab_size, d)
        self.embed_positions = Embedding(config.max_target_positions, d)
        self.layers = nn.ModuleList(WhisperDecoderLayer(config) for _ in range(config.decoder_layers))
        self.layer_norm = LayerNorm(d)

    def forward(self, tokens: torch.Tensor, cache: WhisperKVCache, offset: int) -> torch.Tensor:
        """tokens: [B, T] at positions offset..offset+T-1 -> hidden states [B, T, d_model]; fills the cache."""
        num_new = tokens.shape[1]
        if offset + num_new > cache.max_positions:
            raise ValueError(f"decoder position {offset + num_new} exceeds the cache ({cache.max_positions})")
        positions = self.embed_positions.weight[offset : offset + num_new]
        x = self.embed_tokens(tokens) + positions
        mask = _causal_mask(num_new, offset, tokens.device)
        for index, layer in enumerate(self.layers):
            x = layer(x, cache, index, offset, mask)
        return self.layer_norm(x)


class WhisperInner(nn.Module):
    """Holds encoder and decoder under ``model.`` as the Hugging Face checkpoints do."""

    def __init__(self, config: WhisperConfig) -> None:
        super().__init__()
        self.encoder = WhisperEncoder(config)
        self.decoder = WhisperDecoder(config)


@ARCHITECTURES.register("whisper")
class WhisperForConditionalGeneration(nn.Module):
    config_class = WhisperConfig
    feature_extractor = "whisper_logmel"
    tokenizer = "whisper_hf_json"
    decode_family = "aed"
    default_decode_strategy = "aed_greedy"
    # Checkpoint keys that alias another parameter and are never stored separately.
    tied_keys = {"proj_out.weight": "model.decoder.embed_tokens.weight"}

    def __init__(self, config: WhisperConfig) -> None:
        super().__init__()
        self.config = config
        self.model = WhisperInner(config)
        self.proj_out = Linear(config.d_model, config.vocab_size, bias=False)
        self.proj_out.weight = self.model.decoder.embed_tokens.weight

    @classmethod
    def from_config(cls, config: WhisperConfig) -> WhisperForConditionalGeneration:
        return cls(config)

    @staticmethod
    def tiny_config() -> WhisperConfig:
        return tiny_whisper_config()

    def encode(self, features: torch.Tensor) -> torch.Tensor:
        return self.model.encoder(features.to(self.proj_out.weight.dtype))

    def new_cache(self, encoder_out: torch.Tensor, max_positions: int | None = None) -> WhisperKVCache:
        """Preallocates self-attention K/V and computes cross-attention K/V once for ``encoder_out``."""
        c = self.config
        max_positions = max_positions or c.max_target_positions
        batch = encoder_out.shape[0]
        heads = c.decoder_attention_heads
        shape = (c.decoder_layers, batch, heads, max_positions, c.d_model // heads)
        self_k = encoder_out.new_zeros(shape)
        cross = [layer.encoder_attn.project_kv(encoder_out) for layer in self.model.decoder.layers]
        return WhisperKVCache(
            self_k=self_k,
            self_v=torch.zeros_like(self_k),
            cross_k=torch.stack([k for k, _ in cross]),
            cross_v=torch.stack([v for _, v in cross]),
        )

    def decode(self, tokens: torch.Tensor, cache: WhisperKVCache, offset: int) -> torch.Tensor:
        """tokens: [B, T] -> logits [B, T, vocab] (float32)."""
        return self.proj_out(self.model.decoder(tokens, cache, offset)).float()

    def forward(self, features: torch.Tensor, decoder_input_ids: torch.Tensor) -> torch.Tensor:
        """Teacher-forced logits [B, T, vocab] for a whole token prefix (tests, scoring)."""
        cache = self.new_cache(self.encode(features), max_positions=decoder_input_ids.shape[1])
        return self.decode(decoder_input_ids, cache, offset=0)
