"""Whisper, module for module in the Hugging Face key layout (``model.encoder.layers.0.self_attn.q_proj`` ...).

The decoder attends through a ``SelfAttentionCache`` and a ``CrossAttentionCache`` (the engine's pools, or plain
tensors for teacher forcing); cross-attention K/V are computed once per request by ``cross_kv``/``cross_kv_into``. An optional ``CrossAttentionProbe`` collects
the cross-attention logits of chosen heads (word alignment); without one the decoder runs on SDPA alone.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from oasr.layers import (
    GELU,
    CachedSelfAttention,
    Conv1d,
    CrossAttention,
    Embedding,
    Float32Head,
    LayerNorm,
    Linear,
    MultiHeadAttention,
)
from oasr.layers.attention import KVOut, cross_kv, cross_kv_into
from oasr.layers.cache import CrossAttentionCache, DenseCross, FullContext, SelfAttentionCache
from oasr.models import ARCHITECTURES
from oasr.models.base import CrossSpec, DecoderSpec, EncoderOutput
from oasr.models.capabilities import ModelCapabilities, decoder_step_gemms
from oasr.models.whisper.alignment_probe import CrossAttentionProbe
from oasr.models.whisper.config import WhisperConfig, tiny_whisper_config
from oasr.quantization.spec import SmoothGroup


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
        return x + self.fc2.after(self.act, self.fc1(self.final_layer_norm(x)))


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
        # Rows made contiguous once here: a transposed view would hand its channel-major layout to every residual
        # add after it, each then a strided copy, and LayerNorm would copy its input again (four slow passes per
        # layer, a quarter of large-v3's encoder time on the H200).
        x = self.act(self.conv2(self.act(self.conv1(features)))).transpose(1, 2).contiguous()
        if x.shape[1] != self.embed_positions.num_embeddings:
            raise ValueError(
                f"Whisper's encoder takes {2 * self.embed_positions.num_embeddings} feature frames, got {features.shape[-1]}"
            )
        x = x + self.embed_positions.weight.to(x.dtype)
        for layer in self.layers:
            x = layer(x)
        return self.layer_norm(x)


class WhisperDecoderLayer(nn.Module):
    def __init__(self, config: WhisperConfig) -> None:
        super().__init__()
        d = config.d_model
        self.self_attn = CachedSelfAttention(d, config.decoder_attention_heads)
        self.self_attn_layer_norm = LayerNorm(d)
        self.encoder_attn = CrossAttention(d, config.decoder_attention_heads)
        self.encoder_attn_layer_norm = LayerNorm(d)
        self.fc1 = Linear(d, config.decoder_ffn_dim)
        self.fc2 = Linear(config.decoder_ffn_dim, d)
        self.final_layer_norm = LayerNorm(d)
        self.act = GELU()

    def forward(
        self,
        x: torch.Tensor,
        cache: SelfAttentionCache,
        index: int,
        cross: CrossAttentionCache,
        probe: CrossAttentionProbe | None = None,
    ) -> torch.Tensor:
        """x: [B, T, D] -> [B, T, D]."""
        h = self.self_attn_layer_norm(x)
        x = x + self.self_attn.forward_cached(h, cache, index)
        h = self.encoder_attn_layer_norm(x)
        if probe is not None:
            probe.observe(index, self.encoder_attn, h, cross.keys(index))
        x = x + self.encoder_attn.forward_cross(h, cross, index)
        return x + self.fc2.after(self.act, self.fc1(self.final_layer_norm(x)))


class WhisperDecoder(nn.Module):
    def __init__(self, config: WhisperConfig) -> None:
        super().__init__()
        d = config.d_model
        self.embed_tokens = Embedding(config.vocab_size, d)
        self.embed_positions = Embedding(config.max_target_positions, d)
        self.layers = nn.ModuleList(WhisperDecoderLayer(config) for _ in range(config.decoder_layers))
        self.layer_norm = LayerNorm(d)

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cache: SelfAttentionCache,
        cross: CrossAttentionCache,
        probe: CrossAttentionProbe | None = None,
    ) -> torch.Tensor:
        """tokens, positions: [B, T] -> hidden states [B, T, d_model]."""
        x = self.embed_tokens(tokens) + self.embed_positions(positions)
        for index, layer in enumerate(self.layers):
            x = layer(x, cache, index, cross, probe)
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
    capabilities = ModelCapabilities(
        runner="autoregressive",
        decode_strategies=("aed_greedy", "aed_beam"),
        options=frozenset({"language", "timestamps", "prompt", "temperature", "min_new_tokens"}),
        tasks=("transcribe", "translate"),
        word_timing=True,
        aligner="whisper",  # oasr.models.whisper.alignment
        long_form=("parallel", "sequential"),
        smooth_groups=(
            SmoothGroup("model.encoder.layers.*.self_attn_layer_norm",
                        tuple(f"model.encoder.layers.*.self_attn.{p}_proj" for p in "qkv")),
            SmoothGroup("model.encoder.layers.*.final_layer_norm", ("model.encoder.layers.*.fc1",)),
            SmoothGroup("model.decoder.layers.*.self_attn_layer_norm",
                        tuple(f"model.decoder.layers.*.self_attn.{p}_proj" for p in "qkv")),
            SmoothGroup("model.decoder.layers.*.encoder_attn_layer_norm",
                        ("model.decoder.layers.*.encoder_attn.q_proj",)),
            SmoothGroup("model.decoder.layers.*.final_layer_norm", ("model.decoder.layers.*.fc1",)),
            # The encoder's output is read only by the cross-attention keys and values of every decoder layer.
            SmoothGroup("model.encoder.layer_norm",
                        tuple(f"model.decoder.layers.*.encoder_attn.{p}_proj" for p in "kv")),
        ),
        decode_step_gemms=decoder_step_gemms("model.decoder.layers.*", ("fc1", "fc2")),
    )
    # Checkpoint keys that alias another parameter and are never stored separately.
    tied_keys = {"proj_out.weight": "model.decoder.embed_tokens.weight"}

    def __init__(self, config: WhisperConfig) -> None:
        super().__init__()
        self.config = config
        self.model = WhisperInner(config)
        self.proj_out = Float32Head(config.d_model, config.vocab_size, bias=False)
        self.proj_out.weight = self.model.decoder.embed_tokens.weight

    @classmethod
    def from_config(cls, config: WhisperConfig) -> WhisperForConditionalGeneration:
        return cls(config)

    @staticmethod
    def tiny_config() -> WhisperConfig:
        return tiny_whisper_config()

    @staticmethod
    def example_inputs(config: WhisperConfig, batch_size: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
        """Random features of one window and a three-token prefix: what ``forward`` takes."""
        features = torch.randn(batch_size, config.num_mel_bins, 2 * config.max_source_positions)
        return features, torch.zeros(batch_size, 3, dtype=torch.long)

    @property
    def decoder_spec(self) -> DecoderSpec:
        c = self.config
        heads = c.decoder_attention_heads
        # Every request is a padded 30 s window: its cross-attention spans all encoder positions.
        return DecoderSpec(c.decoder_layers, heads, heads, c.d_model // heads, c.max_target_positions,
                           CrossSpec(c.max_source_positions, fixed=True))

    @staticmethod
    def prompt_builder(config: WhisperConfig, tokenizer, name: str):
        from oasr.models.whisper.prompt import WhisperPrompter

        return WhisperPrompter(config, tokenizer, name)

    def encode(self, features: torch.Tensor, lengths: torch.Tensor | None = None) -> EncoderOutput:
        """features: [B, n_mels, 3000] (one padded window each; ``lengths`` is not needed) -> every encoder
        position of every row."""
        hidden = self.model.encoder(features.to(self.proj_out.weight.dtype))
        full = torch.full((hidden.shape[0],), hidden.shape[1], dtype=torch.long, device=hidden.device)
        return EncoderOutput(hidden, full)

    def cross_kv(self, encoder_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Cross-attention K/V of every decoder layer, computed once per request: each [layers, B, H, S, D]."""
        return cross_kv([layer.encoder_attn for layer in self.model.decoder.layers], encoder_out)

    def cross_kv_into(self, encoder_out: torch.Tensor, k_out: torch.Tensor | Sequence[KVOut],
                      v_out: torch.Tensor | Sequence[KVOut]) -> None:
        """``cross_kv`` into caller buffers, each [layers, B, S, d_model], or one ``KVOut`` per layer
        (``oasr.layers.attention.cross_kv_into``)."""
        cross_kv_into([layer.encoder_attn for layer in self.model.decoder.layers], encoder_out, k_out, v_out)

    def decode(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cache: SelfAttentionCache,
        cross: CrossAttentionCache,
        probe: CrossAttentionProbe | None = None,
    ) -> torch.Tensor:
        """tokens, positions: [B, T] -> logits [B, T, vocab] (float32). ``probe`` (opt-in) records the
        cross-attention logits of its heads on the way."""
        return self.logits(self.decode_hidden(tokens, positions, cache, cross, probe))

    def decode_hidden(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cache: SelfAttentionCache,
        cross: CrossAttentionCache,
        probe: CrossAttentionProbe | None = None,
    ) -> torch.Tensor:
        """Like ``decode`` but stops before the vocabulary projection: [B, T, d_model]. A long prompt needs
        logits at a few positions only; projecting all of them would cost [B, T, vocab]."""
        return self.model.decoder(tokens, positions, cache, cross, probe)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [..., d_model] -> logits [..., vocab], projected in float32 (``Float32Head``)."""
        return self.proj_out(hidden)

    def forward(self, features: torch.Tensor, decoder_input_ids: torch.Tensor) -> torch.Tensor:
        """Teacher-forced logits [B, T, vocab] for a whole token prefix (tests, scoring)."""
        cross_k, cross_v = self.cross_kv(self.encode(features).hidden)
        positions = torch.arange(decoder_input_ids.shape[1], device=decoder_input_ids.device).expand_as(decoder_input_ids)
        return self.decode(decoder_input_ids, positions, FullContext(), DenseCross(cross_k, cross_v))
