"""FastConformer (Parakeet) configurations. Field names follow transformers' ``ParakeetEncoderConfig``,
``ParakeetCTCConfig``, ``ParakeetRNNTConfig`` and ``ParakeetTDTConfig``, so a ``config.json`` written by
``save_pretrained`` loads as is (the encoder nested under ``encoder_config``). Training-only fields (dropout,
loss reduction, initializer range) are read past.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, TypeVar

C = TypeVar("C")


def _known_fields(cls: type[C], values: dict[str, Any]) -> dict[str, Any]:
    """The entries of ``values`` that are fields of ``cls``; a null keeps the default unless the field is optional
    (``pad_token_id: null`` stays None)."""
    nullable = {f.name for f in dataclasses.fields(cls) if "None" in str(f.type)}  # type: ignore[arg-type]
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    return {k: v for k, v in values.items() if k in known and (v is not None or k in nullable)}


@dataclass(frozen=True)
class FastConformerEncoderConfig:
    hidden_size: int = 1024
    num_hidden_layers: int = 24
    num_attention_heads: int = 8
    intermediate_size: int = 4096  # feed-forward width
    hidden_act: str = "silu"  # feed-forward and convolution-module activation
    attention_bias: bool = True  # bias on attention and feed-forward projections
    convolution_bias: bool = True  # bias on the convolution module's convolutions
    conv_kernel_size: int = 9  # depthwise convolution width (odd: 'same' padding)
    subsampling_factor: int = 8  # a power of the stride: one strided convolution per factor of it
    subsampling_conv_channels: int = 256
    num_mel_bins: int = 80
    subsampling_conv_kernel_size: int = 3
    subsampling_conv_stride: int = 2
    scale_input: bool = True  # multiply the subsampled frames by sqrt(hidden_size)

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size {self.hidden_size} must divide evenly into attention heads")
        if self.conv_kernel_size % 2 == 0:
            raise ValueError(f"conv_kernel_size must be odd for 'same' padding, got {self.conv_kernel_size}")
        stride, factor = self.subsampling_conv_stride, self.subsampling_factor
        if self.num_subsampling_layers < 1 or stride**self.num_subsampling_layers != factor:
            raise ValueError(f"subsampling_factor {factor} is not a power of the stride {stride}")

    @property
    def num_subsampling_layers(self) -> int:
        return round(math.log(self.subsampling_factor, self.subsampling_conv_stride))

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> FastConformerEncoderConfig:
        return cls(**_known_fields(cls, values))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _encoder_from(values: dict[str, Any]) -> dict[str, Any]:
    kwargs = dict(values)
    encoder = kwargs.get("encoder_config")
    kwargs["encoder_config"] = FastConformerEncoderConfig.from_dict(encoder or {})
    return kwargs


@dataclass(frozen=True)
class ParakeetCTCConfig:
    encoder_config: FastConformerEncoderConfig = dataclasses.field(default_factory=FastConformerEncoderConfig)
    vocab_size: int = 1025  # including the blank
    # transformers' Parakeet CTC uses the pad token as the CTC blank (its loss and generate do).
    pad_token_id: int | None = 1024

    def __post_init__(self) -> None:
        if not 0 <= self.blank_id < self.vocab_size:
            raise ValueError(f"blank id {self.blank_id} is outside the vocabulary ({self.vocab_size})")

    @property
    def blank_id(self) -> int:
        """The CTC blank: the pad token, else NeMo's convention of the last vocabulary entry."""
        return self.vocab_size - 1 if self.pad_token_id is None else self.pad_token_id

    @property
    def num_mel_bins(self) -> int:
        return self.encoder_config.num_mel_bins

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ParakeetCTCConfig:
        return cls(**_known_fields(cls, _encoder_from(values)))

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "model_type": "parakeet_ctc"}


@dataclass(frozen=True)
class ParakeetRNNTConfig:
    encoder_config: FastConformerEncoderConfig = dataclasses.field(default_factory=FastConformerEncoderConfig)
    vocab_size: int = 8193  # joint token outputs, including the blank
    decoder_hidden_size: int = 640  # prediction network (LSTM) and joint width
    num_decoder_layers: int = 2
    hidden_act: str = "relu"  # joint activation
    max_symbols_per_step: int = 10  # greedy decoding: tokens emitted at one frame before it is forced forward
    blank_token_id: int = 8192  # distinct from pad_token_id for transducers
    pad_token_id: int | None = 2

    def __post_init__(self) -> None:
        if not 0 <= self.blank_token_id < self.vocab_size:
            raise ValueError(f"blank_token_id {self.blank_token_id} is outside the vocabulary ({self.vocab_size})")
        if self.max_symbols_per_step < 1:
            raise ValueError("max_symbols_per_step must be at least 1")

    @property
    def blank_id(self) -> int:
        return self.blank_token_id

    @property
    def num_mel_bins(self) -> int:
        return self.encoder_config.num_mel_bins

    @property
    def num_joint_outputs(self) -> int:
        return self.vocab_size

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ParakeetRNNTConfig:
        kwargs = _known_fields(cls, _encoder_from(values))
        if "durations" in kwargs:
            kwargs["durations"] = tuple(int(d) for d in kwargs["durations"])
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "model_type": "parakeet_rnnt"}


@dataclass(frozen=True)
class ParakeetTDTConfig(ParakeetRNNTConfig):
    # Frames a token (or blank) may span; the joint predicts an index into this tuple beside the token.
    durations: tuple[int, ...] = (0, 1, 2, 3, 4)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.durations or min(self.durations) < 0:
            raise ValueError(f"durations must be non-empty and non-negative, got {self.durations}")

    @property
    def num_joint_outputs(self) -> int:
        return self.vocab_size + len(self.durations)

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "durations": list(self.durations), "model_type": "parakeet_tdt"}


def tiny_encoder_config() -> FastConformerEncoderConfig:
    """A few-thousand-parameter FastConformer: every module of the real one, random weights."""
    return FastConformerEncoderConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        conv_kernel_size=5,
        subsampling_conv_channels=8,
        num_mel_bins=16,
    )


def tiny_ctc_config() -> ParakeetCTCConfig:
    return ParakeetCTCConfig(encoder_config=tiny_encoder_config(), vocab_size=33, pad_token_id=32)


def _tiny_transducer_fields() -> dict[str, Any]:
    return dict(encoder_config=tiny_encoder_config(), vocab_size=33, decoder_hidden_size=24, num_decoder_layers=1,
                blank_token_id=32, pad_token_id=32)


def tiny_rnnt_config() -> ParakeetRNNTConfig:
    return ParakeetRNNTConfig(**_tiny_transducer_fields())


def tiny_tdt_config() -> ParakeetTDTConfig:
    return ParakeetTDTConfig(**_tiny_transducer_fields())
