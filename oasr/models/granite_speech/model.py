"""Granite Speech (``GraniteSpeechForConditionalGeneration``): a conformer encoder over stacked log-mel frames, a
windowed Q-Former projector and a Granite language model whose prompt carries the audio, in the checkpoint's key
layout (``encoder.*``, ``projector.*``, ``language_model.model.*``, ``language_model.lm_head`` where untied).

A request of ``n`` stacked frames (20 ms each) has ``ceil(n / window_size) * num_queries`` audio positions (3 per
300 ms for the released 15 / 5). The model declares ``PromptAudio``; the engine's autoregressive runner splices
them into the prompt's ``<|audio|>`` run. Granite's scales of the embeddings, the residuals and the attention are in
the shared decoder (``oasr.models.voxtral.language_model``); its ``logits_scaling`` is not applied (see ``logits``).
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
from oasr.models.granite_speech.config import GraniteSpeechConfig, tiny_granite_speech_config
from oasr.models.granite_speech.encoder import ConformerEncoder, WindowProjector
from oasr.models.granite_speech.prompt import GraniteSpeechPrompter
from oasr.models.voxtral.language_model import TextModel

FRAME_SECONDS = 0.02  # a stacked frame
WINDOW_SECONDS = 30.0  # one request's audio; longer inputs are cut at quiet points by the transcription driver
TEXT_POSITIONS = 512  # beyond the audio's: the chat template and a 30 s transcript


class GraniteLanguageModel(nn.Module):
    """The language model and its head under ``language_model.`` (``.model.*``, ``.lm_head``)."""

    def __init__(self, config: GraniteSpeechConfig) -> None:
        super().__init__()
        text = config.text_config
        self.model = TextModel(text)
        self.lm_head = Float32Head(text.hidden_size, text.vocab_size, bias=False)
        if text.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight


@ARCHITECTURES.register("granite_speech")
class GraniteSpeechForConditionalGeneration(nn.Module):
    config_class: ClassVar[type[GraniteSpeechConfig]] = GraniteSpeechConfig
    feature_extractor = "granite_logmel"
    tokenizer = "hf_json"
    tied_keys: ClassVar[dict[str, str]] = {"language_model.lm_head.weight": "language_model.model.embed_tokens.weight"}
    capabilities = ModelCapabilities(
        runner="autoregressive",
        decode_strategies=("aed_greedy",),
        options=frozenset({"temperature", "min_new_tokens"}),
        window_seconds=WINDOW_SECONDS,
    )

    def __init__(self, config: GraniteSpeechConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = ConformerEncoder(config.encoder_config)
        self.projector = WindowProjector(config)
        self.language_model = GraniteLanguageModel(config)

    @classmethod
    def from_config(cls, config: GraniteSpeechConfig) -> GraniteSpeechForConditionalGeneration:
        return cls(config)

    @staticmethod
    def tiny_config() -> GraniteSpeechConfig:
        return tiny_granite_speech_config()

    @staticmethod
    def example_inputs(config: GraniteSpeechConfig, batch_size: int = 2) -> tuple[torch.Tensor, ...]:
        """(features [B, 160, 100], lengths [B], a prompt [B, T] with each row's audio positions)."""
        lengths = torch.tensor([100 - 17 * i for i in range(batch_size)])
        features = torch.randn(batch_size, config.encoder_config.input_dim, 100)
        audio = [-(-int(n) // config.window_size) * config.num_queries for n in lengths]
        rows = [[1] + [config.audio_token_index] * n + [2] * (audio[0] - n + 2) for n in audio]
        return features, lengths, torch.tensor(rows)

    @classmethod
    def prompt_builder(cls, config: GraniteSpeechConfig, tokenizer, name: str) -> GraniteSpeechPrompter:
        return GraniteSpeechPrompter(tokenizer, name, vocab_size=config.text_config.vocab_size,
                                     audio_token_id=config.audio_token_index, eos_token_ids=config.eos_token_id)

    @property
    def decoder_spec(self) -> DecoderSpec:
        text = self.config.text_config
        audio = self.encoder_frames(int(WINDOW_SECONDS / FRAME_SECONDS) + 1)
        positions = min(text.max_position_embeddings, audio + TEXT_POSITIONS)
        return DecoderSpec(text.num_hidden_layers, text.num_attention_heads, text.num_key_value_heads, text.head_dim,
                           positions, cross=None, prompt_audio=PromptAudio(audio))

    def encoder_frames(self, num_feature_frames: int) -> int:
        """Audio positions of ``num_feature_frames`` stacked frames: whole projector windows."""
        return -(-num_feature_frames // self.config.window_size) * self.config.num_queries

    def encode(self, features: torch.Tensor, lengths: torch.Tensor) -> EncoderOutput:
        """features: [B, 160, T] stacked frames; lengths: [B] valid frames -> EncoderOutput (hidden [B, S, d] in
        the language model's width; lengths [B] each row's audio positions)."""
        x = features.to(self.language_model.lm_head.weight.dtype).transpose(1, 2)
        valid = torch.arange(x.shape[1], device=x.device)[None, :] < lengths.to(x.device)[:, None]
        hidden = self.encoder(x, valid) * valid[..., None].to(x.dtype)  # a lone input's windows end in zeros
        counts = torch.tensor([self.encoder_frames(int(n)) for n in lengths.tolist()], device=features.device)
        return EncoderOutput(hidden=self.projector(hidden), lengths=counts)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [B, T] -> their embeddings [B, T, d], before Granite's embedding scale (the decoder applies it,
        to the audio positions too, as transformers does)."""
        return self.language_model.model.embed_tokens(tokens)

    def decode_embedded(self, embeds: torch.Tensor, positions: torch.Tensor, cache: SelfAttentionCache) -> torch.Tensor:
        return self.language_model.model(embeds, positions, cache)

    def decode_hidden(self, tokens: torch.Tensor, positions: torch.Tensor, cache: SelfAttentionCache,
                      cross: CrossAttentionCache | None = None) -> torch.Tensor:
        return self.decode_embedded(self.embed(tokens), positions, cache)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [..., d] -> logits [..., vocab] in float32. Not divided by ``logits_scaling``: transformers'
        Granite Speech head leaves them as they are (its Granite LM alone would divide), and its log-probabilities
        and sampling temperatures are the ones this model is checked against."""
        return self.language_model.lm_head(hidden)

    def forward(self, features: torch.Tensor, lengths: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        """Teacher-forced logits [B, T, vocab] of whole prompts whose ``<|audio|>`` ids take each row's audio
        positions in order, as transformers splices them (tests, scoring)."""
        encoded = self.encode(features, lengths)
        embeds = self.embed(input_ids)
        audio = input_ids == self.config.audio_token_index
        valid = torch.arange(encoded.hidden.shape[1], device=input_ids.device) < encoded.lengths[:, None]
        embeds[audio] = encoded.hidden[valid].to(embeds.dtype)
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        return self.logits(self.decode_embedded(embeds, positions, FullContext()))
