"""Qwen2-Audio configuration, field for field as transformers' ``Qwen2AudioConfig`` writes ``config.json``: the
audio tower under ``audio_config`` (``Qwen2AudioEncoderConfig``, Whisper's field names), the Qwen2 language model
under ``text_config``, and the id of ``<|AUDIO|>`` (``audio_token_index``) at the top level. Fields a config.json
leaves out take transformers' defaults (Qwen2-Audio-7B's).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from oasr.models.fastconformer.config import _known_fields
from oasr.models.voxtral.language_model import TextConfig


@dataclass(frozen=True)
class Qwen2AudioEncoderConfig:
    num_mel_bins: int = 128
    d_model: int = 1280
    encoder_layers: int = 32
    encoder_attention_heads: int = 20
    encoder_ffn_dim: int = 5120
    max_source_positions: int = 1500  # encoder frames of the 30 s window (3,000 feature frames, stride 2)
    activation_function: str = "gelu"
    scale_embedding: bool = False

    def __post_init__(self) -> None:
        if self.activation_function != "gelu" or self.scale_embedding:
            raise ValueError("only Whisper's encoder (activation gelu, no embedding scale) is supported")
        if self.d_model % self.encoder_attention_heads:
            raise ValueError(f"d_model {self.d_model} is not divisible by {self.encoder_attention_heads} heads")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Qwen2AudioEncoderConfig:
        return cls(**_known_fields(cls, values))


# transformers' Qwen2Config defaults, which Qwen2AudioConfig's text_config starts from.
_TEXT_DEFAULTS = dict(vocab_size=151_936, hidden_size=4096, intermediate_size=22_016, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=32_768,
                      rms_norm_eps=1e-6, rope_theta=10_000.0, tie_word_embeddings=False)


@dataclass(frozen=True)
class Qwen2AudioConfig:
    audio_config: Qwen2AudioEncoderConfig = dataclasses.field(default_factory=Qwen2AudioEncoderConfig)
    text_config: TextConfig = dataclasses.field(
        default_factory=lambda: TextConfig(**_TEXT_DEFAULTS, head_dim=128, qkv_bias=True, model_type="qwen2"))
    audio_token_index: int = 151_646  # <|AUDIO|>
    eos_token_id: tuple[int, ...] = (151_643,)  # <|endoftext|>

    @property
    def num_mel_bins(self) -> int:
        return self.audio_config.num_mel_bins

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Qwen2AudioConfig:
        audio = Qwen2AudioEncoderConfig.from_dict(values.get("audio_config") or {})
        text_values = {**_TEXT_DEFAULTS, **(values.get("text_config") or {})}
        kwargs = _known_fields(cls, {**values, "audio_token_index": values.get(
            "audio_token_index", values.get("audio_token_id", cls.audio_token_index))})
        eos = kwargs.get("eos_token_id", text_values.get("eos_token_id", cls.eos_token_id))
        kwargs["eos_token_id"] = tuple(eos) if isinstance(eos, (list, tuple)) else (eos,)
        text = TextConfig.from_dict(text_values, qkv_bias=True, model_type="qwen2")
        return cls(audio_config=audio, text_config=text, **{
            k: v for k, v in kwargs.items() if k not in ("audio_config", "text_config")})

    def to_dict(self) -> dict[str, Any]:
        return {
            "audio_config": {**dataclasses.asdict(self.audio_config), "model_type": "qwen2_audio_encoder"},
            "text_config": self.text_config.to_dict(),
            "audio_token_index": self.audio_token_index,
            "eos_token_id": list(self.eos_token_id),
            "model_type": "qwen2_audio",
        }


def tiny_qwen2_audio_config() -> Qwen2AudioConfig:
    """A few-thousand-parameter model with every module of the real one: Whisper's geometry in time (a 30 s
    window, 1,500 encoder frames pooled to 750), 16 mels, grouped key/value heads (4 over 2, where the 7B model has
    none) and a vocabulary of 280 ids (256 bytes, the prompt's specials, a few merges)."""
    audio = Qwen2AudioEncoderConfig(num_mel_bins=16, d_model=32, encoder_layers=2, encoder_attention_heads=4,
                                    encoder_ffn_dim=64)
    text = TextConfig(vocab_size=280, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=2048,
                      rms_norm_eps=1e-6, rope_theta=10_000.0, qkv_bias=True, model_type="qwen2")
    return Qwen2AudioConfig(audio_config=audio, text_config=text, audio_token_index=259, eos_token_id=(256,))
