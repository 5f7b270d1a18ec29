"""Paraformer's configuration, read from the sections of FunASR's ``config.yaml`` (``encoder_conf``,
``decoder_conf``, ``predictor_conf``, ``frontend_conf``) under FunASR's own field names, so a model folder's
config loads as written. Training-only fields (dropout, label smoothing, loss weights) are read past.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from oasr.features.funasr_fbank import FunasrFbankConfig


def known_fields(cls: type, values: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in (values or {}).items() if k in names and v is not None}


@dataclass(frozen=True)
class SANMEncoderConfig:
    """FunASR's ``SANMEncoder``: the first layer reads the LFR frames (``input_size`` wide), the others
    ``output_size``; each layer is self-attention plus an FSMN memory (a depthwise convolution over the values)."""

    input_size: int = 560
    output_size: int = 512
    attention_heads: int = 4
    linear_units: int = 2048
    num_blocks: int = 50  # encoders0 (one layer) plus num_blocks - 1 in encoders
    kernel_size: int = 11  # FSMN width
    sanm_shfit: int = 0  # FunASR's spelling: extra left context of the FSMN window
    input_layer: str = "pe"  # sinusoidal positions added to the scaled input, no projection
    normalize_before: bool = True
    selfattention_layer_type: str = "sanm"
    positionwise_layer_type: str = "linear"
    concat_after: bool = False

    def __post_init__(self) -> None:
        if self.output_size % self.attention_heads:
            raise ValueError(f"output_size {self.output_size} must divide into {self.attention_heads} heads")


@dataclass(frozen=True)
class ParaformerDecoderConfig:
    """FunASR's ``ParaformerSANMDecoder``: ``att_layer_num`` layers with FSMN self-memory and cross-attention,
    ``num_blocks - att_layer_num`` with the memory only (decoders2), then one feed-forward layer (decoders3)."""

    attention_heads: int = 4
    linear_units: int = 2048
    num_blocks: int = 16
    att_layer_num: int = 16
    kernel_size: int = 11
    sanm_shfit: int = 0
    normalize_before: bool = True
    concat_after: bool = False
    input_layer: str = "embed"  # a token embedding the checkpoint holds; the CIF embeddings are the input


@dataclass(frozen=True)
class CifPredictorConfig:
    """FunASR's ``CifPredictorV2``: a convolution over the encoder frames gives each frame a weight (alpha);
    a token fires each time the running sum of weights crosses ``threshold``."""

    idim: int = 512
    l_order: int = 1
    r_order: int = 1
    threshold: float = 1.0
    smooth_factor: float = 1.0
    noise_threshold: float = 0.0
    tail_threshold: float = 0.45  # weight added after each input's last frame, so a last partial token fires
    tail_mask: bool = True


@dataclass(frozen=True)
class ParaformerConfig:
    vocab_size: int
    encoder: SANMEncoderConfig = field(default_factory=SANMEncoderConfig)
    decoder: ParaformerDecoderConfig = field(default_factory=ParaformerDecoderConfig)
    predictor: CifPredictorConfig = field(default_factory=CifPredictorConfig)
    frontend: FunasrFbankConfig = field(default_factory=FunasrFbankConfig)
    blank_id: int = 0
    sos: int = 1
    eos: int = 2

    def __post_init__(self) -> None:
        if self.encoder.input_size != self.frontend.feature_size:
            raise ValueError(f"the encoder reads {self.encoder.input_size}-wide frames but the frontend stacks "
                             f"{self.frontend.feature_size} (n_mels * lfr_m)")
        if self.predictor.idim != self.encoder.output_size:
            raise ValueError(f"predictor idim {self.predictor.idim} differs from the encoder's output_size "
                             f"{self.encoder.output_size}")
        if self.decoder.att_layer_num > self.decoder.num_blocks:
            raise ValueError(f"decoder att_layer_num {self.decoder.att_layer_num} exceeds num_blocks "
                             f"{self.decoder.num_blocks}")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ParaformerConfig:
        """From a FunASR ``config.yaml`` mapping (plus ``vocab_size`` and the CMVN under ``frontend_conf``)."""
        encoder = {"input_size": values.get("input_size", 560), **(values.get("encoder_conf") or {})}
        return cls(
            vocab_size=int(values["vocab_size"]),
            encoder=SANMEncoderConfig(**known_fields(SANMEncoderConfig, encoder)),
            decoder=ParaformerDecoderConfig(**known_fields(ParaformerDecoderConfig, values.get("decoder_conf"))),
            predictor=CifPredictorConfig(**known_fields(CifPredictorConfig, values.get("predictor_conf"))),
            frontend=FunasrFbankConfig.from_dict(values.get("frontend_conf") or {}),
            **known_fields(_Specials, values.get("model_conf") or {}),
        )

    def to_dict(self) -> dict[str, Any]:
        """The ``from_dict`` mapping of this configuration."""
        frontend = self.frontend
        return {
            "vocab_size": self.vocab_size, "input_size": self.encoder.input_size,
            "encoder_conf": dataclasses.asdict(self.encoder), "decoder_conf": dataclasses.asdict(self.decoder),
            "predictor_conf": dataclasses.asdict(self.predictor),
            "frontend_conf": {"fs": frontend.sample_rate, "n_mels": frontend.num_mel_bins,
                              "frame_length": frontend.frame_length_ms, "frame_shift": frontend.frame_shift_ms,
                              "window": frontend.window, "lfr_m": frontend.lfr_m, "lfr_n": frontend.lfr_n,
                              "cmvn_shift": list(frontend.cmvn_shift), "cmvn_scale": list(frontend.cmvn_scale)},
            "model_conf": {"blank_id": self.blank_id, "sos": self.sos, "eos": self.eos},
        }


@dataclass(frozen=True)
class _Specials:
    """The special ids ``model_conf`` may set (FunASR's defaults: blank 0, sos 1, eos 2)."""

    blank_id: int = 0
    sos: int = 1
    eos: int = 2


def tiny_config() -> ParaformerConfig:
    """A small random Paraformer for smoke tests (80 mels stacked 7 at a time, as every FunASR checkpoint)."""
    return ParaformerConfig(
        vocab_size=32,
        encoder=SANMEncoderConfig(output_size=32, attention_heads=4, linear_units=48, num_blocks=2),
        decoder=ParaformerDecoderConfig(attention_heads=4, linear_units=48, num_blocks=2, att_layer_num=1),
        predictor=CifPredictorConfig(idim=32),
    )
