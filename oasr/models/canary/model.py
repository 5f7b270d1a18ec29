"""Canary (NVIDIA) and Cohere Transcribe: the FastConformer encoder and a transformer decoder, in transformers' key
layout (``model.encoder.*``, ``model.decoder.*``, ``proj_out``).

One class per checkpoint family over the same modules (``oasr.models.canary.decoder``); they differ in their
config class (where ``config.json`` keeps the decoder fields), in whether ``proj_out`` is tied to the token
embedding, and in the prompt's leading token. The methods are the ones the engine's encoder-decoder runner calls:
``encode`` once per input, ``cross_kv_into`` once per request, ``decode_hidden`` and ``logits`` per step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch
from torch import nn

from oasr.layers import Float32Head
from oasr.layers.attention import KVOut, cross_kv, cross_kv_into
from oasr.layers.cache import CrossAttentionCache, DenseCross, FullContext, SelfAttentionCache
from oasr.models import ARCHITECTURES
from oasr.models.base import CrossSpec, DecoderSpec, EncoderOutput
from oasr.models.capabilities import ModelCapabilities, decoder_step_gemms
from oasr.models.canary.config import CanaryConfig, CohereAsrConfig, tiny_canary_config, tiny_cohere_config
from oasr.models.canary.decoder import AEDDecoder
from oasr.models.canary.prompt import CanaryPrompter
from oasr.models.fastconformer.encoder import FastConformerEncoder, example_features

# What ``decoder_dims`` returns: (num_layers, num_heads, num_kv_heads, head_dim, max_positions).
DecoderDims = tuple[int, int, int, int, int]
SAMPLE_RATE = 16_000


class CanaryInner(nn.Module):
    """Holds encoder and decoder under ``model.`` as the transformers checkpoints do."""

    def __init__(self, config: CanaryConfig) -> None:
        super().__init__()
        self.encoder = FastConformerEncoder(config.encoder_config)
        self.decoder = AEDDecoder(config.decoder_config)


@ARCHITECTURES.register("canary")
class CanaryForConditionalGeneration(nn.Module):
    config_class: ClassVar[type[CanaryConfig]] = CanaryConfig
    feature_extractor = "aed_logmel"
    tokenizer = "hf_json"
    # Checkpoint keys that alias another parameter and are never stored separately.
    tied_keys: ClassVar[dict[str, str]] = {"proj_out.weight": "model.decoder.embed_tokens.weight"}
    # Pieces before <|startofcontext|> in the prompt (by name); Cohere's prompt starts with the word boundary.
    prompt_prefix: ClassVar[tuple[str, ...]] = ()
    # Whether the checkpoint writes a language other than the spoken one (Canary translates; Cohere does not).
    translates: ClassVar[bool] = True
    # Requests attend to their own encoder length (cross-attention in per-request blocks); audio longer than a
    # window is cut at quiet points by the transcription driver. Canary was trained on segments of up to 40 s.
    capabilities = ModelCapabilities(
        runner="autoregressive",
        decode_strategies=("aed_greedy", "hf_beam"),  # beam search as transformers' generate
        options=frozenset({"language", "target_language", "punctuation", "temperature", "min_new_tokens"}),
        tasks=("transcribe", "translate"),
        window_seconds=40.0,
        decode_step_gemms=decoder_step_gemms("model.decoder.layers.*", ("mlp.fc1", "mlp.fc2")),
    )

    def __init__(self, config: CanaryConfig) -> None:
        super().__init__()
        self.config = config
        decoder = config.decoder_config
        self.model = CanaryInner(config)
        self.proj_out = Float32Head(decoder.hidden_size, decoder.vocab_size, bias=True)
        if decoder.tie_word_embeddings:
            self.proj_out.weight = self.model.decoder.embed_tokens.weight

    @classmethod
    def from_config(cls, config: CanaryConfig) -> CanaryForConditionalGeneration:
        return cls(config)

    @staticmethod
    def tiny_config() -> CanaryConfig:
        return tiny_canary_config()

    @staticmethod
    def example_inputs(config: CanaryConfig, batch_size: int = 2) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(features [B, n_mels, T], lengths [B], a three-token prefix [B, 3]): what ``forward`` takes."""
        features, lengths = example_features(config.encoder_config, batch_size)
        return features, lengths, torch.zeros(batch_size, 3, dtype=torch.long)

    @classmethod
    def prompt_builder(cls, config: CanaryConfig, tokenizer, name: str) -> CanaryPrompter:
        prefix = cls.prompt_prefix if config.prompt_prefix is None else config.prompt_prefix
        return CanaryPrompter(tokenizer, name, prefix=prefix, translates=cls.translates,
                              default_language=config.default_language,
                              vocab_size=config.decoder_config.vocab_size)

    @property
    def decoder_spec(self) -> DecoderSpec:
        layers, heads, kv_heads, head_dim, positions = self.decoder_dims
        window_frames = int(self.capabilities.window_seconds * SAMPLE_RATE) // 160 + 1
        return DecoderSpec(layers, heads, kv_heads, head_dim, positions,
                           CrossSpec(self.encoder_frames(window_frames), fixed=False))

    def encoder_frames(self, num_feature_frames: int) -> int:
        """Encoder positions of ``num_feature_frames`` feature frames (the subsampling's arithmetic)."""
        return int(self.model.encoder.output_lengths(num_feature_frames))  # plain ints: no tensor per request

    @property
    def decoder_dims(self) -> DecoderDims:
        d = self.config.decoder_config
        return d.num_hidden_layers, d.num_attention_heads, d.num_key_value_heads, d.head_dim, d.max_position_embeddings

    def encode(self, features: torch.Tensor, lengths: torch.Tensor) -> EncoderOutput:
        """features: [B, n_mels, T]; lengths: [B] feature frames -> EncoderOutput (hidden [B, S, d] in the decoder's
        width, after the encoder-to-decoder projection where there is one; lengths [B] valid encoder frames)."""
        out = self.model.encoder(features.to(self.proj_out.weight.dtype), lengths)
        if self.config.decoder_config.encoder_hidden_size is not None:
            out = EncoderOutput(hidden=self.model.decoder.proj(out.hidden), lengths=out.lengths)
        return out

    def cross_kv(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden: [B, S, d] (``encode``'s) -> cross-attention (k, v) of every decoder layer, each [layers, B, H, S, D]."""
        return cross_kv([layer.encoder_attn for layer in self.model.decoder.layers], hidden)

    def cross_kv_into(self, hidden: torch.Tensor, k_out: torch.Tensor | Sequence[KVOut],
                      v_out: torch.Tensor | Sequence[KVOut]) -> None:
        """``cross_kv`` into caller buffers, each [layers, B, S, num_heads * head_dim], or one ``KVOut`` per layer
        (``oasr.layers.attention.cross_kv_into``)."""
        cross_kv_into([layer.encoder_attn for layer in self.model.decoder.layers], hidden, k_out, v_out)

    def decode_hidden(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cache: SelfAttentionCache,
        cross: CrossAttentionCache,
    ) -> torch.Tensor:
        """tokens, positions: [B, T] -> decoder states [B, T, d], before the vocabulary projection (a prompt needs
        logits at its last position only)."""
        return self.model.decoder(tokens, positions, cache, cross)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [..., d] -> logits [..., vocab], projected in float32 (``Float32Head``)."""
        return self.proj_out(hidden)

    def forward(self, features: torch.Tensor, lengths: torch.Tensor, decoder_input_ids: torch.Tensor) -> torch.Tensor:
        """Teacher-forced logits [B, T, vocab] for a whole token prefix (tests, scoring)."""
        encoded = self.encode(features, lengths)
        k, v = self.cross_kv(encoded.hidden)
        positions = torch.arange(decoder_input_ids.shape[1], device=decoder_input_ids.device)
        hidden = self.decode_hidden(
            decoder_input_ids, positions.expand_as(decoder_input_ids), FullContext(), DenseCross(k, v, encoded.lengths)
        )
        return self.logits(hidden)


@ARCHITECTURES.register("cohere_asr")
class CohereAsrForConditionalGeneration(CanaryForConditionalGeneration):
    config_class: ClassVar[type[CanaryConfig]] = CohereAsrConfig
    tied_keys: ClassVar[dict[str, str]] = {}
    # transformers' CohereAsrProcessor.get_decoder_prompt_ids puts the word boundary '▁' first.
    prompt_prefix: ClassVar[tuple[str, ...]] = ("\u2581",)
    translates: ClassVar[bool] = False
    # Cohere's feature extractor cuts clips over 30 s into chunks of at most 30 s.
    capabilities = ModelCapabilities(
        runner="autoregressive",
        decode_strategies=("aed_greedy", "hf_beam"),  # beam search as transformers' generate
        options=frozenset({"language", "punctuation", "temperature", "min_new_tokens"}),
        window_seconds=30.0,
        decode_step_gemms=decoder_step_gemms("model.decoder.layers.*", ("mlp.fc1", "mlp.fc2")),
    )

    @staticmethod
    def tiny_config() -> CohereAsrConfig:
        return tiny_cohere_config()
