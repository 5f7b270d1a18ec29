"""Granite Speech configuration, field for field as transformers' ``GraniteSpeechConfig`` writes ``config.json``:
the conformer under ``encoder_config``, the Q-Former under ``projector_config`` (a ``blip_2_qformer`` config), the
Granite language model under ``text_config``, and at the top level the id of ``<|audio|>``
(``audio_token_index``), the projector's window and downsampling, and ``has_lora_adapter``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from oasr.models.fastconformer.config import _known_fields
from oasr.models.voxtral.language_model import TextConfig


@dataclass(frozen=True)
class GraniteEncoderConfig:
    input_dim: int = 160  # two stacked 80-bin log-mel frames per encoder frame (20 ms)
    num_layers: int = 10
    hidden_dim: int = 1024
    feedforward_mult: int = 4
    num_heads: int = 8
    dim_head: int | None = None
    output_dim: int = 42  # the mid-stack CTC head's classes, fed back into the stream
    context_size: int = 200  # frames per attention block
    max_pos_emb: int = 512  # relative distances of Shaw's embedding table, each way
    conv_kernel_size: int = 15
    conv_expansion_factor: int = 2

    def __post_init__(self) -> None:
        if self.dim_head is None:
            object.__setattr__(self, "dim_head", self.hidden_dim // self.num_heads)
        if not 0 < self.context_size <= self.max_pos_emb:
            raise ValueError(f"context_size {self.context_size} must be in 1 .. max_pos_emb ({self.max_pos_emb})")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> GraniteEncoderConfig:
        return cls(**_known_fields(cls, values))


@dataclass(frozen=True)
class QFormerConfig:
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    layer_norm_eps: float = 1e-12
    cross_attention_frequency: int = 2  # layer i cross-attends to the audio when i % frequency == 0
    encoder_hidden_size: int = 1024

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"Q-Former hidden_size {self.hidden_size} is not divisible by its heads")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> QFormerConfig:
        if values.get("use_qformer_text_input"):
            raise ValueError("a Q-Former with text input (use_qformer_text_input) is not supported")
        return cls(**_known_fields(cls, values))


# transformers' GraniteConfig defaults, which GraniteSpeechConfig's text_config starts from.
_TEXT_DEFAULTS = dict(vocab_size=32_000, hidden_size=4096, intermediate_size=11_008, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=2048,
                      rms_norm_eps=1e-6, rope_theta=10_000.0, tie_word_embeddings=True, embedding_multiplier=1.0,
                      residual_multiplier=1.0, attention_multiplier=1.0, logits_scaling=1.0)


@dataclass(frozen=True)
class GraniteSpeechConfig:
    encoder_config: GraniteEncoderConfig = dataclasses.field(default_factory=GraniteEncoderConfig)
    projector_config: QFormerConfig = dataclasses.field(default_factory=QFormerConfig)
    text_config: TextConfig = dataclasses.field(default_factory=lambda: TextConfig(**_TEXT_DEFAULTS, head_dim=128,
                                                                                   model_type="granite"))
    audio_token_index: int = 49_155  # <|audio|>
    downsample_rate: int = 5
    window_size: int = 15  # encoder frames per Q-Former window; window_size // downsample_rate queries each
    eos_token_id: tuple[int, ...] = (0,)  # <|end_of_text|>

    def __post_init__(self) -> None:
        if self.window_size % self.downsample_rate:
            raise ValueError(f"window_size {self.window_size} is not a multiple of downsample_rate "
                             f"{self.downsample_rate}")
        if self.projector_config.encoder_hidden_size != self.encoder_config.hidden_dim:
            raise ValueError("the Q-Former's encoder_hidden_size must be the encoder's hidden_dim")

    @property
    def num_queries(self) -> int:
        return self.window_size // self.downsample_rate

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> GraniteSpeechConfig:
        if values.get("has_lora_adapter", True):
            # The releases carry a LoRA adapter for the language model, active whenever audio is in the prompt;
            # merging it into the weights at load is not done yet, and decoding without it would be wrong.
            raise ValueError("has_lora_adapter: the checkpoint's LoRA adapter is not applied by OASR yet (merge it "
                             "into the language model and set has_lora_adapter to false)")
        text_values = {**_TEXT_DEFAULTS, **(values.get("text_config") or {})}
        if "tie_word_embeddings" in values and "tie_word_embeddings" not in (values.get("text_config") or {}):
            text_values["tie_word_embeddings"] = values["tie_word_embeddings"]
        kwargs = _known_fields(cls, values)
        eos = kwargs.get("eos_token_id", text_values.get("eos_token_id", cls.eos_token_id))
        kwargs["eos_token_id"] = tuple(eos) if isinstance(eos, (list, tuple)) else (eos,)
        return cls(encoder_config=GraniteEncoderConfig.from_dict(values.get("encoder_config") or {}),
                   projector_config=QFormerConfig.from_dict(values.get("projector_config") or {}),
                   text_config=TextConfig.from_dict(text_values, model_type="granite"),
                   **{k: v for k, v in kwargs.items()
                      if k not in ("encoder_config", "projector_config", "text_config")})

    def to_dict(self) -> dict[str, Any]:
        text = self.text_config.to_dict()
        for name in ("embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling"):
            text[name] = getattr(self.text_config, name)
        return {
            "encoder_config": {**dataclasses.asdict(self.encoder_config), "model_type": "granite_speech_encoder"},
            "projector_config": {**dataclasses.asdict(self.projector_config), "model_type": "blip_2_qformer"},
            "text_config": text,
            "audio_token_index": self.audio_token_index,
            "downsample_rate": self.downsample_rate,
            "window_size": self.window_size,
            "eos_token_id": list(self.eos_token_id),
            "has_lora_adapter": False,
            "tie_word_embeddings": self.text_config.tie_word_embeddings,
            "model_type": "granite_speech",
        }


def tiny_granite_speech_config() -> GraniteSpeechConfig:
    """A few-thousand-parameter model with every module of the real one: two conformer blocks (the mid-stack CTC
    feedback after the first) attending in blocks of 20 frames, a two-layer Q-Former cross-attending in both
    layers, 15-frame windows giving 3 positions each, Granite's four scales, grouped key/value heads and a
    vocabulary of 280 ids."""
    encoder = GraniteEncoderConfig(num_layers=2, hidden_dim=32, feedforward_mult=2, num_heads=4, output_dim=6,
                                   context_size=20, max_pos_emb=24, conv_kernel_size=5)
    projector = QFormerConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
                              cross_attention_frequency=1, encoder_hidden_size=32)
    text = TextConfig(vocab_size=280, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=2048,
                      rms_norm_eps=1e-5, rope_theta=10_000.0, tie_word_embeddings=True, embedding_multiplier=12.0,
                      residual_multiplier=0.22, attention_multiplier=0.5, logits_scaling=8.0,
                      model_type="granite")
    return GraniteSpeechConfig(encoder_config=encoder, projector_config=projector, text_config=text,
                               audio_token_index=259, eos_token_id=(256,))
