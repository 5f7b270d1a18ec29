"""Qwen3-ASR (``Qwen3ASRForConditionalGeneration``): the audio encoder and projector, whose output is spliced
into the prompt of a Qwen3 language model, in transformers' key layout (``model.audio_tower.*``,
``model.multi_modal_projector.*``, ``model.language_model.*``, ``lm_head``).

The model declares ``PromptAudio`` (``oasr.models.base``): no cross-attention; each request's encoder positions
take the embeddings of its prompt's ``<|audio_pad|>`` positions. The engine's autoregressive runner calls ``encode``
once per input, ``embed`` and ``decode_embedded`` for the prompt, ``decode_hidden`` and ``logits`` per step.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from oasr.layers import Float32Head
from oasr.layers.cache import CrossAttentionCache, FullContext, SelfAttentionCache
from oasr.models import ARCHITECTURES
from oasr.models.base import DecoderSpec, EncoderOutput, PromptAudio
from oasr.models.capabilities import ModelCapabilities
from oasr.models.qwen3_asr.config import Qwen3ASRConfig, tiny_qwen3_asr_config
from oasr.models.qwen3_asr.encoder import MultiModalProjector, Qwen3AudioEncoder, encoder_positions
from oasr.models.qwen3_asr.language_model import Qwen3TextModel
from oasr.models.qwen3_asr.prompt import Qwen3ASRPrompter

SAMPLE_RATE = 16_000
HOP_LENGTH = 160
# Decoder positions beyond a full window's audio: the prompt's text, a context and the transcript.
TEXT_POSITIONS = 1024


class Qwen3ASRInner(nn.Module):
    """Holds the three parts under ``model.`` as the transformers checkpoints do."""

    def __init__(self, config: Qwen3ASRConfig) -> None:
        super().__init__()
        self.audio_tower = Qwen3AudioEncoder(config.audio_config)
        self.multi_modal_projector = MultiModalProjector(config)
        self.language_model = Qwen3TextModel(config.text_config)


@ARCHITECTURES.register("qwen3_asr")
class Qwen3ASRForConditionalGeneration(nn.Module):
    config_class: ClassVar[type[Qwen3ASRConfig]] = Qwen3ASRConfig
    feature_extractor = "qwen3_logmel"
    tokenizer = "qwen3_asr_json"
    tied_keys: ClassVar[dict[str, str]] = {"lm_head.weight": "model.language_model.embed_tokens.weight"}
    # Audio over 30 s is cut at quiet points by the transcription driver (the encoder itself takes any length).
    capabilities = ModelCapabilities(
        runner="autoregressive",
        decode_strategies=("aed_greedy",),
        options=frozenset({"language", "prompt", "temperature", "min_new_tokens"}),
        window_seconds=30.0,
        # No decode_step_gemms: the language model's GEMMs also run its prefill over every audio position (13 per
        # second), where 8 bits pay; which way decode steps go on this model is not measured yet.
    )

    def __init__(self, config: Qwen3ASRConfig) -> None:
        super().__init__()
        self.config = config
        text = config.text_config
        self.model = Qwen3ASRInner(config)
        self.lm_head = Float32Head(text.hidden_size, text.vocab_size, bias=False)
        if text.tie_word_embeddings:
            self.lm_head.weight = self.model.language_model.embed_tokens.weight

    @classmethod
    def from_config(cls, config: Qwen3ASRConfig) -> Qwen3ASRForConditionalGeneration:
        return cls(config)

    @staticmethod
    def tiny_config() -> Qwen3ASRConfig:
        return tiny_qwen3_asr_config()

    @staticmethod
    def example_inputs(config: Qwen3ASRConfig, batch_size: int = 2) -> tuple[torch.Tensor, ...]:
        """(features [B, n_mels, 200], lengths [B], a prompt [B, T] with the audio positions of the longest row):
        what ``forward`` takes."""
        frames = 2 * config.chunk_frames
        lengths = torch.tensor([frames - 37 * i for i in range(batch_size)])
        features = torch.randn(batch_size, config.num_mel_bins, frames)
        audio = [encoder_positions(int(n), config.chunk_frames) for n in lengths]
        rows = [[1] + [config.audio_token_id] * n + [2] * (audio[0] - n + 3) for n in audio]
        return features, lengths, torch.tensor(rows)

    @classmethod
    def prompt_builder(cls, config: Qwen3ASRConfig, tokenizer, name: str) -> Qwen3ASRPrompter:
        return Qwen3ASRPrompter(tokenizer, name, vocab_size=config.text_config.vocab_size,
                                audio_token_id=config.audio_token_id, eos_token_ids=config.eos_token_id)

    @property
    def decoder_spec(self) -> DecoderSpec:
        text = self.config.text_config
        window = self.encoder_frames(int(self.capabilities.window_seconds * SAMPLE_RATE) // HOP_LENGTH)
        positions = min(text.max_position_embeddings, window + TEXT_POSITIONS)
        return DecoderSpec(text.num_hidden_layers, text.num_attention_heads, text.num_key_value_heads, text.head_dim,
                           positions, cross=None, prompt_audio=PromptAudio(window))

    def encoder_frames(self, num_feature_frames: int) -> int:
        """Audio positions (prompt embeddings) of ``num_feature_frames`` feature frames."""
        return encoder_positions(num_feature_frames, self.config.chunk_frames)

    def encode(self, features: torch.Tensor, lengths: torch.Tensor) -> EncoderOutput:
        """features: [B, n_mels, T] (T whole chunks); lengths: [B] valid frames -> EncoderOutput (hidden [B, S, d]
        in the language model's width, after the projector; lengths [B] valid audio positions)."""
        hidden, counts = self.model.audio_tower(features.to(self.lm_head.weight.dtype), lengths)
        return EncoderOutput(hidden=self.model.multi_modal_projector(hidden), lengths=counts)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [B, T] -> their embeddings [B, T, d] (a new tensor: the runner writes the audio into it)."""
        return self.model.language_model.embed_tokens(tokens)

    def decode_embedded(self, embeds: torch.Tensor, positions: torch.Tensor, cache: SelfAttentionCache) -> torch.Tensor:
        """embeds, positions: [B, T, d], [B, T] -> hidden states [B, T, d], before the vocabulary projection."""
        return self.model.language_model(embeds, positions, cache)

    def decode_hidden(self, tokens: torch.Tensor, positions: torch.Tensor, cache: SelfAttentionCache,
                      cross: CrossAttentionCache | None = None) -> torch.Tensor:
        """tokens, positions: [B, T] -> hidden states [B, T, d]; ``cross`` is None (no cross-attention)."""
        return self.decode_embedded(self.embed(tokens), positions, cache)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [..., d] -> logits [..., vocab], projected in float32 (``Float32Head``)."""
        return self.lm_head(hidden)

    def forward(self, features: torch.Tensor, lengths: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        """Teacher-forced logits [B, T, vocab] of whole prompts whose ``<|audio_pad|>`` ids (``audio_token_id``)
        take each row's audio positions in order, as transformers splices them (tests, scoring)."""
        encoded = self.encode(features, lengths)
        embeds = self.embed(input_ids)
        audio = input_ids == self.config.audio_token_id
        valid = torch.arange(encoded.hidden.shape[1], device=input_ids.device) < encoded.lengths[:, None]
        embeds[audio] = encoded.hidden[valid].to(embeds.dtype)
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        return self.logits(self.decode_embedded(embeds, positions, FullContext()))
