"""Nemotron ASR streaming configurations. Field names follow transformers' ``NemotronAsrStreamingEncoderConfig``
and ``NemotronAsrStreamingConfig``, so a ``config.json`` written by ``save_pretrained`` loads as is (the encoder
nested under ``encoder_config``). Training-only fields (dropout, layerdrop, initializer range) are read past.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from oasr.models.fastconformer.config import (
    FastConformerEncoderConfig,
    ParakeetRNNTConfig,
    _known_fields,
    tiny_encoder_config,
)
from oasr.streaming.geometry import TAIL_RULES


@dataclass(frozen=True)
class NemotronAsrStreamingEncoderConfig(FastConformerEncoderConfig):
    # Keys one query may attend to behind it, plus itself (encoder frames): left context = sliding_window - 1.
    sliding_window: int = 71
    # Right context (lookahead, encoder frames) of the chunked-limited attention when none is chosen; offline
    # (whole-file) decoding uses it, as transformers' forward does.
    default_num_lookahead_tokens: int = 13
    # How a stream's last, short chunk is encoded and decoded (``oasr.streaming.geometry.TAIL_RULES``): "pad" as
    # transformers' streaming generate (a transformers config.json names none), "mask" as NeMo's cache-aware
    # streaming loop (set by the .nemo converter).
    stream_tail: str = "pad"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.sliding_window < 1:
            raise ValueError(f"sliding_window must be at least 1, got {self.sliding_window}")
        if self.default_num_lookahead_tokens < 0:
            raise ValueError(f"default_num_lookahead_tokens must be >= 0, got {self.default_num_lookahead_tokens}")
        if self.stream_tail not in TAIL_RULES:
            raise ValueError(f"stream_tail must be one of {', '.join(TAIL_RULES)}, got {self.stream_tail!r}")

    @property
    def left_context(self) -> int:
        return self.sliding_window - 1

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> NemotronAsrStreamingEncoderConfig:
        return cls(**_known_fields(cls, values))


@dataclass(frozen=True)
class NemotronAsrStreamingConfig(ParakeetRNNTConfig):
    encoder_config: NemotronAsrStreamingEncoderConfig = dataclasses.field(
        default_factory=NemotronAsrStreamingEncoderConfig
    )
    vocab_size: int = 1025  # joint token outputs, including the blank
    blank_token_id: int = 1024  # the last vocabulary entry (NeMo's convention)
    pad_token_id: int | None = 0

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> NemotronAsrStreamingConfig:
        kwargs = dict(values)
        kwargs["encoder_config"] = NemotronAsrStreamingEncoderConfig.from_dict(kwargs.get("encoder_config") or {})
        return cls(**_known_fields(cls, kwargs))

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "model_type": "nemotron_asr_streaming"}


def tiny_config() -> NemotronAsrStreamingConfig:
    """A few-thousand-parameter model with every module of the real one. The attention window is small enough
    (chunks of 3 frames, 2 chunks of left context) that the tests' inputs of 6 to 21 frames exercise it."""
    encoder = NemotronAsrStreamingEncoderConfig(**dataclasses.asdict(tiny_encoder_config()), sliding_window=7,
                                                default_num_lookahead_tokens=2)
    return NemotronAsrStreamingConfig(encoder_config=encoder, vocab_size=33, decoder_hidden_size=24,
                                      num_decoder_layers=1, blank_token_id=32, pad_token_id=32)
