"""Qwen2-Audio (``Qwen2AudioForConditionalGeneration``): Whisper's encoder over one 30 s window with the padding
past the audio masked out of attention, average pooling by two, a linear projector, and a Qwen2 language model
whose prompt carries the audio, in the key layout of the published checkpoints (``audio_tower.*``,
``multi_modal_projector.linear``, ``language_model.model.*``, ``language_model.lm_head``), which transformers'
``save_pretrained`` also writes.

A request's audio positions are those its valid frames reach: ``n`` feature frames give ``(n - 1) // 2 + 1``
encoder frames, pooled to ``(that - 2) // 2 + 1`` positions (750 for a full window). Inputs over 30 s are cut by
the transcription driver at quiet points, as the processor's feature extractor would cut them at 30 s.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from oasr.layers import GELU, Conv1d, Embedding, Float32Head, LayerNorm, Linear, MultiHeadAttention, sdpa
from oasr.layers.cache import CrossAttentionCache, FullContext, SelfAttentionCache
from oasr.models import ARCHITECTURES
from oasr.models.base import DecoderSpec, EncoderOutput, PromptAudio
from oasr.models.capabilities import ModelCapabilities
from oasr.models.qwen2_audio.config import Qwen2AudioConfig, Qwen2AudioEncoderConfig, tiny_qwen2_audio_config
from oasr.models.qwen2_audio.prompt import Qwen2AudioPrompter
from oasr.models.voxtral.language_model import TextModel

# Decoder positions beyond the audio's (750 at most): the instruction and a 30 s transcript.
TEXT_POSITIONS = 512


def audio_positions(num_feature_frames: int) -> int:
    """Prompt positions of ``num_feature_frames`` valid frames: conv2's stride, then the pooling's."""
    encoder_frames = (num_feature_frames - 1) // 2 + 1
    return (encoder_frames - 2) // 2 + 1


class EncoderLayer(nn.Module):
    """Whisper's pre-LN encoder layer, with a key mask (the window's padding past the audio)."""

    def __init__(self, config: Qwen2AudioEncoderConfig) -> None:
        super().__init__()
        d = config.d_model
        self.self_attn = MultiHeadAttention(d, config.encoder_attention_heads)
        self.self_attn_layer_norm = LayerNorm(d)
        self.fc1 = Linear(d, config.encoder_ffn_dim)
        self.fc2 = Linear(config.encoder_ffn_dim, d)
        self.final_layer_norm = LayerNorm(d)
        self.act = GELU()

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x: [B, S, d]; mask: bool [B, 1, 1, S] (True = a key to attend) -> [B, S, d]."""
        h = self.self_attn_layer_norm(x)
        x = x + self.self_attn.project_out(sdpa(*self.self_attn.project_qkv(h), mask=mask))
        return x + self.fc2.after(self.act, self.fc1(self.final_layer_norm(x)))


class Qwen2AudioEncoder(nn.Module):
    def __init__(self, config: Qwen2AudioEncoderConfig) -> None:
        super().__init__()
        d = config.d_model
        self.conv1 = Conv1d(config.num_mel_bins, d, kernel_size=3, padding=1)
        self.conv2 = Conv1d(d, d, kernel_size=3, stride=2, padding=1)
        self.embed_positions = Embedding(config.max_source_positions, d)
        self.layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.encoder_layers))
        self.layer_norm = LayerNorm(d)
        self.act = GELU()

    def forward(self, features: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """features: [B, n_mels, 3000]; lengths: [B] valid feature frames -> pooled hidden states [B, 750, d]."""
        x = self.act(self.conv2(self.act(self.conv1(features)))).transpose(1, 2).contiguous()
        x = x + self.embed_positions.weight.to(x.dtype)
        valid = (lengths.to(x.device) - 1) // 2 + 1
        mask = (torch.arange(x.shape[1], device=x.device)[None, :] < valid[:, None])[:, None, None, :]
        for layer in self.layers:
            x = layer(x, mask)
        x = F.avg_pool1d(x.transpose(1, 2), 2, 2).transpose(1, 2)
        return self.layer_norm(x)


class Qwen2AudioProjector(nn.Module):
    def __init__(self, config: Qwen2AudioConfig) -> None:
        super().__init__()
        self.linear = Linear(config.audio_config.d_model, config.text_config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


class Qwen2AudioLanguageModel(nn.Module):
    """The language model and its head under ``language_model.`` (``.model.*``, ``.lm_head``)."""

    def __init__(self, config: Qwen2AudioConfig) -> None:
        super().__init__()
        text = config.text_config
        self.model = TextModel(text)
        self.lm_head = Float32Head(text.hidden_size, text.vocab_size, bias=False)
        if text.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight


@ARCHITECTURES.register("qwen2_audio")
class Qwen2AudioForConditionalGeneration(nn.Module):
    config_class: ClassVar[type[Qwen2AudioConfig]] = Qwen2AudioConfig
    feature_extractor = "masked_whisper_logmel"
    tokenizer = "hf_json"
    tied_keys: ClassVar[dict[str, str]] = {"language_model.lm_head.weight": "language_model.model.embed_tokens.weight"}
    capabilities = ModelCapabilities(
        runner="autoregressive",
        decode_strategies=("aed_greedy",),
        options=frozenset({"language", "temperature", "min_new_tokens"}),
    )

    def __init__(self, config: Qwen2AudioConfig) -> None:
        super().__init__()
        self.config = config
        self.audio_tower = Qwen2AudioEncoder(config.audio_config)
        self.multi_modal_projector = Qwen2AudioProjector(config)
        self.language_model = Qwen2AudioLanguageModel(config)

    @classmethod
    def from_config(cls, config: Qwen2AudioConfig) -> Qwen2AudioForConditionalGeneration:
        return cls(config)

    @staticmethod
    def tiny_config() -> Qwen2AudioConfig:
        return tiny_qwen2_audio_config()

    @staticmethod
    def example_inputs(config: Qwen2AudioConfig, batch_size: int = 2) -> tuple[torch.Tensor, ...]:
        """(features [B, n_mels, 3000], lengths [B], a prompt [B, T] with the audio positions of each row)."""
        frames = 2 * config.audio_config.max_source_positions
        lengths = torch.tensor([frames - 37 * i for i in range(batch_size)])
        features = torch.randn(batch_size, config.num_mel_bins, frames)
        longest = audio_positions(frames)
        rows = [[257] + [config.audio_token_index] * audio_positions(int(n)) + [258] * (longest - audio_positions(int(n)) + 2)
                for n in lengths]
        return features, lengths, torch.tensor(rows)

    @classmethod
    def prompt_builder(cls, config: Qwen2AudioConfig, tokenizer, name: str) -> Qwen2AudioPrompter:
        return Qwen2AudioPrompter(tokenizer, name, vocab_size=config.text_config.vocab_size,
                                  audio_token_id=config.audio_token_index, eos_token_ids=config.eos_token_id)

    @property
    def decoder_spec(self) -> DecoderSpec:
        text = self.config.text_config
        audio = self.encoder_frames(2 * self.config.audio_config.max_source_positions)
        positions = min(text.max_position_embeddings, audio + TEXT_POSITIONS)
        return DecoderSpec(text.num_hidden_layers, text.num_attention_heads, text.num_key_value_heads, text.head_dim,
                           positions, cross=None, prompt_audio=PromptAudio(audio))

    def encoder_frames(self, num_feature_frames: int) -> int:
        """Audio positions (prompt embeddings) of ``num_feature_frames`` valid feature frames."""
        return audio_positions(num_feature_frames)

    def encode(self, features: torch.Tensor, lengths: torch.Tensor) -> EncoderOutput:
        """features: [B, n_mels, 3000]; lengths: [B] valid frames -> EncoderOutput (hidden [B, 750, d] in the
        language model's width, after the projector; lengths [B] each row's audio positions)."""
        hidden = self.audio_tower(features.to(self.language_model.lm_head.weight.dtype), lengths)
        counts = torch.tensor([audio_positions(int(n)) for n in lengths.tolist()], device=features.device)
        return EncoderOutput(hidden=self.multi_modal_projector(hidden), lengths=counts)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [B, T] -> their embeddings [B, T, d] (a new tensor: the runner writes the audio into it)."""
        return self.language_model.model.embed_tokens(tokens)

    def decode_embedded(self, embeds: torch.Tensor, positions: torch.Tensor, cache: SelfAttentionCache) -> torch.Tensor:
        """embeds, positions: [B, T, d], [B, T] -> hidden states [B, T, d], before the vocabulary projection."""
        return self.language_model.model(embeds, positions, cache)

    def decode_hidden(self, tokens: torch.Tensor, positions: torch.Tensor, cache: SelfAttentionCache,
                      cross: CrossAttentionCache | None = None) -> torch.Tensor:
        """tokens, positions: [B, T] -> hidden states [B, T, d]; ``cross`` is None (no cross-attention)."""
        return self.decode_embedded(self.embed(tokens), positions, cache)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [..., d] -> logits [..., vocab], projected in float32 (``Float32Head``)."""
        return self.language_model.lm_head(hidden)

    def forward(self, features: torch.Tensor, lengths: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        """Teacher-forced logits [B, T, vocab] of whole prompts whose ``<|AUDIO|>`` ids take each row's audio
        positions in order, as transformers splices them (tests, scoring)."""
        encoded = self.encode(features, lengths)
        embeds = self.embed(input_ids)
        audio = input_ids == self.config.audio_token_index
        valid = torch.arange(encoded.hidden.shape[1], device=input_ids.device) < encoded.lengths[:, None]
        embeds[audio] = encoded.hidden[valid].to(embeds.dtype)
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        return self.logits(self.decode_embedded(embeds, positions, FullContext()))
