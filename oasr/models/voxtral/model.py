"""Voxtral (``VoxtralForConditionalGeneration``): Whisper's encoder, a projector over four stacked encoder frames,
and a Mistral language model whose prompt carries the projected audio, in the key layout of the published
checkpoints (``audio_tower.*``, ``multi_modal_projector.*``, ``language_model.model.*``, ``language_model.lm_head``),
which transformers' ``save_pretrained`` also writes.

The encoder reads 30 s windows (3,000 feature frames, 1,500 encoder frames each, no mask: a short input's window
is padded with silence and all of it is kept, as the processor does). Each window's 1,500 frames become 375 rows
of four frames side by side, which the projector (Linear, GELU, Linear, no biases) maps to the language model's
width: 375 audio positions per window. An input longer than 30 s is several windows, one after another in the
same prompt (``oasr.features.chunked_logmel``), so a request holds up to ``window_seconds`` of audio.

The model declares ``PromptAudio``: no cross-attention; the engine's autoregressive runner splices each request's
audio positions into its prompt's ``[AUDIO]`` run and decodes through the paged K/V pool.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from oasr.layers import Float32Head, Linear, activation
from oasr.layers.cache import CrossAttentionCache, FullContext, SelfAttentionCache
from oasr.models import ARCHITECTURES
from oasr.models.base import DecoderSpec, EncoderOutput, PromptAudio
from oasr.models.capabilities import ModelCapabilities
from oasr.models.voxtral.config import FRAMES_PER_POSITION, VoxtralConfig, tiny_voxtral_config
from oasr.models.voxtral.language_model import TextModel
from oasr.models.voxtral.prompt import VoxtralPrompter
from oasr.models.whisper.model import WhisperEncoder

WINDOW_SECONDS = 30
# One request's audio, at most (the transcription driver cuts longer inputs at quiet points): ten windows.
REQUEST_SECONDS = 300.0
# Decoder positions beyond the audio's: the request's text and the transcript of up to REQUEST_SECONDS of speech.
TEXT_POSITIONS = 2048


class VoxtralProjector(nn.Module):
    def __init__(self, config: VoxtralConfig) -> None:
        super().__init__()
        self.linear_1 = Linear(config.audio_config.intermediate_size, config.text_config.hidden_size, bias=False)
        self.act = activation(config.projector_hidden_act)
        self.linear_2 = Linear(config.text_config.hidden_size, config.text_config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [N, 4 * d_audio] stacked encoder frames -> [N, d_text]."""
        return self.linear_2(self.act(self.linear_1(x)))


class VoxtralLanguageModel(nn.Module):
    """The language model and its head under ``language_model.`` (``.model.*``, ``.lm_head``), as the published
    checkpoints hold them (transformers' own modules since 5.0 nest them differently and rename on load)."""

    def __init__(self, config: VoxtralConfig) -> None:
        super().__init__()
        text = config.text_config
        self.model = TextModel(text)
        self.lm_head = Float32Head(text.hidden_size, text.vocab_size, bias=False)
        if text.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight


@ARCHITECTURES.register("voxtral")
class VoxtralForConditionalGeneration(nn.Module):
    config_class: ClassVar[type[VoxtralConfig]] = VoxtralConfig
    feature_extractor = "chunked_whisper_logmel"
    tokenizer = "tekken"
    tied_keys: ClassVar[dict[str, str]] = {"language_model.lm_head.weight": "language_model.model.embed_tokens.weight"}
    capabilities = ModelCapabilities(
        runner="autoregressive",
        decode_strategies=("aed_greedy",),
        options=frozenset({"language", "temperature", "min_new_tokens"}),
        window_seconds=REQUEST_SECONDS,
    )

    def __init__(self, config: VoxtralConfig) -> None:
        super().__init__()
        self.config = config
        self.audio_tower = WhisperEncoder(config.audio_config)
        self.multi_modal_projector = VoxtralProjector(config)
        self.language_model = VoxtralLanguageModel(config)

    @classmethod
    def from_config(cls, config: VoxtralConfig) -> VoxtralForConditionalGeneration:
        return cls(config)

    @staticmethod
    def tiny_config() -> VoxtralConfig:
        return tiny_voxtral_config()

    @staticmethod
    def example_inputs(config: VoxtralConfig, batch_size: int = 2) -> tuple[torch.Tensor, ...]:
        """(features [B, n_mels, 3000], lengths [B], a prompt [B, T] with one window's audio positions)."""
        audio = config.audio_config
        features = torch.randn(batch_size, audio.num_mel_bins, audio.window_frames)
        lengths = torch.full((batch_size,), audio.window_frames)
        rows = [[1, 3, 25] + [config.audio_token_id] * audio.window_positions + [4, 34]] * batch_size
        return features, lengths, torch.tensor(rows)

    @classmethod
    def prompt_builder(cls, config: VoxtralConfig, tokenizer, name: str) -> VoxtralPrompter:
        return VoxtralPrompter(tokenizer, name, vocab_size=config.text_config.vocab_size,
                               audio_token_id=config.audio_token_id, eos_token_ids=config.eos_token_id)

    @property
    def decoder_spec(self) -> DecoderSpec:
        text = self.config.text_config
        audio = self.encoder_frames(int(REQUEST_SECONDS // WINDOW_SECONDS) * self.config.audio_config.window_frames)
        positions = min(text.max_position_embeddings, audio + TEXT_POSITIONS)
        return DecoderSpec(text.num_hidden_layers, text.num_attention_heads, text.num_key_value_heads, text.head_dim,
                           positions, cross=None, prompt_audio=PromptAudio(audio))

    def encoder_frames(self, num_feature_frames: int) -> int:
        """Audio positions of ``num_feature_frames`` feature frames (whole windows: 375 per 3,000 frames)."""
        audio = self.config.audio_config
        return -(-num_feature_frames // audio.window_frames) * audio.window_positions

    def encode(self, features: torch.Tensor, lengths: torch.Tensor) -> EncoderOutput:
        """features: [B, n_mels, W * 3000] (each row's windows, then zeros); lengths: [B] feature frames (whole
        windows) -> EncoderOutput (hidden [B, W * 375, d] in the language model's width, each row's positions
        from its front; lengths [B] its audio positions). Only the windows holding a row's audio are encoded."""
        audio = self.config.audio_config
        b, mels, frames = features.shape
        per_row = frames // audio.window_frames
        windows = [-(-int(n) // audio.window_frames) for n in lengths.tolist()]
        index = [row * per_row + w for row, count in enumerate(windows) for w in range(count)]
        chosen = torch.tensor(index, device=features.device)
        x = features.to(self.language_model.lm_head.weight.dtype).view(b, mels, per_row, audio.window_frames)
        x = x.permute(0, 2, 1, 3).reshape(b * per_row, mels, audio.window_frames)[chosen]
        hidden = self.audio_tower(x)  # [N, 1500, d_audio]
        n = hidden.shape[0]
        stacked = hidden.reshape(n * audio.window_positions, FRAMES_PER_POSITION * audio.hidden_size)
        projected = self.multi_modal_projector(stacked).view(n, audio.window_positions, -1)
        out = projected.new_zeros(b * per_row, audio.window_positions, projected.shape[-1])
        out[chosen] = projected
        counts = torch.tensor([w * audio.window_positions for w in windows], device=features.device)
        return EncoderOutput(hidden=out.view(b, per_row * audio.window_positions, -1), lengths=counts)

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
        """Teacher-forced logits [B, T, vocab] of whole prompts whose ``[AUDIO]`` ids take each row's audio
        positions in order, as transformers splices them (tests, scoring)."""
        encoded = self.encode(features, lengths)
        embeds = self.embed(input_ids)
        audio = input_ids == self.config.audio_token_id
        valid = torch.arange(encoded.hidden.shape[1], device=input_ids.device) < encoded.lengths[:, None]
        embeds[audio] = encoded.hidden[valid].to(embeds.dtype)
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        return self.logits(self.decode_embedded(embeds, positions, FullContext()))
