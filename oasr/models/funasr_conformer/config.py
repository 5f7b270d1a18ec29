"""FunASR's Conformer configuration, read from its ``config.yaml`` (``encoder_conf``, ``decoder_conf``,
``model_conf``, ``frontend_conf``). Only the fields OASR's modules read are kept; the converter refuses the values
they are not built for (another subsampling, absolute positions, post-norm layers...), naming the field."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from oasr.features.funasr_fbank import FunasrFbankConfig
from oasr.models.paraformer.config import known_fields


@dataclass(frozen=True)
class ConformerEncoderConfig:
    """``ConformerEncoder`` with conv2d subsampling (4x), legacy relative positions, swish, a convolution module
    and, with ``macaron_style``, a half-step feed-forward before the attention."""

    input_size: int = 80
    output_size: int = 256
    attention_heads: int = 4
    linear_units: int = 2048
    num_blocks: int = 12
    macaron_style: bool = False
    use_cnn_module: bool = True
    cnn_module_kernel: int = 31

    def __post_init__(self) -> None:
        if self.output_size % self.attention_heads:
            raise ValueError(f"output_size {self.output_size} is not a multiple of attention_heads "
                             f"{self.attention_heads}")
        if self.cnn_module_kernel % 2 == 0:
            raise ValueError(f"cnn_module_kernel must be odd (same padding), got {self.cnn_module_kernel}")


@dataclass(frozen=True)
class TransformerDecoderConfig:
    """``TransformerDecoder``: token embedding plus absolute sinusoids, pre-norm layers of causal self-attention,
    cross-attention over the encoder frames and a ReLU feed-forward."""

    attention_heads: int = 4
    linear_units: int = 2048
    num_blocks: int = 6


@dataclass(frozen=True)
class FunasrConformerConfig:
    vocab_size: int
    encoder: ConformerEncoderConfig = field(default_factory=ConformerEncoderConfig)
    decoder: TransformerDecoderConfig = field(default_factory=TransformerDecoderConfig)
    frontend: FunasrFbankConfig = field(default_factory=lambda: FunasrFbankConfig(lfr_m=1, lfr_n=1))
    blank_id: int = 0
    sos: int = 1  # FunASR's Transformer defaults: <s> and </s> are the rows after <blank>
    eos: int = 2

    def __post_init__(self) -> None:
        if self.encoder.input_size != self.frontend.feature_size:
            raise ValueError(f"the encoder reads {self.encoder.input_size}-wide frames but the frontend gives "
                             f"{self.frontend.feature_size} (n_mels * lfr_m)")
        for name in ("blank_id", "sos", "eos"):
            if not 0 <= getattr(self, name) < self.vocab_size:
                raise ValueError(f"{name} {getattr(self, name)} is outside the vocabulary of {self.vocab_size}")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> FunasrConformerConfig:
        encoder = {"input_size": values.get("input_size", 80), **(values.get("encoder_conf") or {})}
        model = values.get("model_conf") or {}
        return cls(vocab_size=int(values["vocab_size"]),
                   encoder=ConformerEncoderConfig(**known_fields(ConformerEncoderConfig, encoder)),
                   decoder=TransformerDecoderConfig(**known_fields(TransformerDecoderConfig,
                                                                   values.get("decoder_conf") or {})),
                   frontend=FunasrFbankConfig.from_dict(values.get("frontend_conf") or {}),  # no LFR unless named
                   blank_id=int(model.get("blank_id", 0)), sos=int(model.get("sos", 1)), eos=int(model.get("eos", 2)))

    def to_dict(self) -> dict[str, Any]:
        f = self.frontend
        return {"vocab_size": self.vocab_size, "input_size": self.encoder.input_size,
                "encoder_conf": dataclasses.asdict(self.encoder), "decoder_conf": dataclasses.asdict(self.decoder),
                "model_conf": {"blank_id": self.blank_id, "sos": self.sos, "eos": self.eos},
                "frontend_conf": {"fs": f.sample_rate, "n_mels": f.num_mel_bins, "frame_length": f.frame_length_ms,
                                  "frame_shift": f.frame_shift_ms, "window": f.window, "lfr_m": f.lfr_m,
                                  "lfr_n": f.lfr_n, "cmvn_shift": list(f.cmvn_shift),
                                  "cmvn_scale": list(f.cmvn_scale)}}


def tiny_config() -> FunasrConformerConfig:
    return FunasrConformerConfig(
        vocab_size=40,
        encoder=ConformerEncoderConfig(output_size=32, attention_heads=4, linear_units=48, num_blocks=2,
                                       macaron_style=True, cnn_module_kernel=7),
        decoder=TransformerDecoderConfig(attention_heads=4, linear_units=48, num_blocks=2))
