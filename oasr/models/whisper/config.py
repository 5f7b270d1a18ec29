"""Whisper's configuration. Field names follow Hugging Face's ``WhisperConfig`` so its config.json loads as is."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

# Vocabulary sizes tell the checkpoint kinds apart, as openai-whisper does: English-only models have 51864
# entries; multilingual ones 51865 (99 languages) or 51866 (large-v3: 100 languages, with Cantonese).
_MULTILINGUAL_MIN_VOCAB = 51865
_BASE_LANGUAGE_COUNT = 99


@dataclass(frozen=True)
class WhisperConfig:
    vocab_size: int = 51865
    num_mel_bins: int = 80
    d_model: int = 384
    encoder_layers: int = 4
    encoder_attention_heads: int = 6
    encoder_ffn_dim: int = 1536
    decoder_layers: int = 4
    decoder_attention_heads: int = 6
    decoder_ffn_dim: int = 1536
    max_source_positions: int = 1500
    max_target_positions: int = 448
    # Generation defaults that belong to the checkpoint (from generation_config.json or CTranslate2's config).
    suppress_tokens: tuple[int, ...] = ()
    begin_suppress_tokens: tuple[int, ...] = ()
    # (decoder layer, head) pairs whose cross-attention follows the audio in time (word timestamps); empty when
    # the checkpoint names none, and then ``word_alignment_heads`` falls back to openai-whisper's default.
    alignment_heads: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        if self.d_model % self.encoder_attention_heads or self.d_model % self.decoder_attention_heads:
            raise ValueError(f"d_model {self.d_model} must divide evenly into attention heads")
        for name in ("vocab_size", "num_mel_bins", "d_model", "max_source_positions", "max_target_positions"):
            if getattr(self, name) <= 0:
                raise ValueError(f"WhisperConfig.{name} must be positive")
        for layer, head in self.alignment_heads:
            if not (0 <= layer < self.decoder_layers and 0 <= head < self.decoder_attention_heads):
                raise ValueError(
                    f"alignment head ({layer}, {head}) is outside the decoder's "
                    f"{self.decoder_layers} layers x {self.decoder_attention_heads} heads"
                )

    @property
    def word_alignment_heads(self) -> tuple[tuple[int, int], ...]:
        """The heads word timestamps read: the checkpoint's own, else every head of the later half of the decoder
        layers (openai-whisper's default when a model's heads are not known)."""
        if self.alignment_heads:
            return self.alignment_heads
        later = range(self.decoder_layers // 2, self.decoder_layers)
        return tuple((layer, head) for layer in later for head in range(self.decoder_attention_heads))

    @property
    def is_multilingual(self) -> bool:
        return self.vocab_size >= _MULTILINGUAL_MIN_VOCAB

    @property
    def num_languages(self) -> int:
        return self.vocab_size - _MULTILINGUAL_MIN_VOCAB + _BASE_LANGUAGE_COUNT if self.is_multilingual else 1

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> WhisperConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in values.items() if k in known and v is not None}
        for key in ("suppress_tokens", "begin_suppress_tokens"):
            if key in kwargs:
                kwargs[key] = tuple(int(t) for t in kwargs[key])
        if "alignment_heads" in kwargs:
            kwargs["alignment_heads"] = tuple((int(a), int(b)) for a, b in kwargs["alignment_heads"])
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        values = dataclasses.asdict(self)
        values["alignment_heads"] = [list(pair) for pair in self.alignment_heads]
        values["suppress_tokens"] = list(self.suppress_tokens)
        values["begin_suppress_tokens"] = list(self.begin_suppress_tokens)
        return values


def tiny_whisper_config() -> WhisperConfig:
    """A few-thousand-parameter Whisper for tests: real shapes' structure, random weights."""
    return WhisperConfig(
        vocab_size=51865,
        num_mel_bins=80,
        d_model=64,
        encoder_layers=2,
        encoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_layers=2,
        decoder_attention_heads=4,
        decoder_ffn_dim=128,
        max_source_positions=1500,
        max_target_positions=448,
        suppress_tokens=(1, 2, 7),
        begin_suppress_tokens=(220, 50257),
    )


