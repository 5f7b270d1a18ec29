"""SeACo-Paraformer's configuration: the Paraformer's (``ParaformerConfig``, read from the same ``config.yaml``
sections) plus what its hotword path reads from ``model_conf`` (``inner_dim``, ``NO_BIAS``) and ``seaco_decoder_conf``, and how hotwords are spelled (``hotword_spelling``, which the ``funasr`` converter
fills from the folder's token list and ``seg_dict``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from oasr.models.paraformer.config import (
    CifPredictorConfig,
    ParaformerConfig,
    ParaformerDecoderConfig,
    SANMEncoderConfig,
    known_fields,
)
from oasr.models.seaco_paraformer.hotwords import HotwordSpelling

# FunASR's ``ParaformerSANMDecoder`` defaults, which a ``seaco_decoder_conf`` leaving a field out gets (they are
# not ``ParaformerDecoderConfig``'s, which follow Paraformer-large's main decoder).
SEACO_DECODER_DEFAULTS: dict[str, Any] = {"attention_heads": 4, "linear_units": 2048, "num_blocks": 6,
                                          "att_layer_num": 6, "kernel_size": 21, "sanm_shfit": 0}


def seaco_decoder_config(values: dict[str, Any] | None) -> ParaformerDecoderConfig:
    """FunASR builds ``att_layer_num`` cross-attention layers whatever ``num_blocks`` says, and layers without
    cross-attention only past it (SeACo-Paraformer-large: num_blocks 4 under the default 6 -> six layers)."""
    merged = {**SEACO_DECODER_DEFAULTS, **known_fields(ParaformerDecoderConfig, values or {})}
    merged["num_blocks"] = max(merged["num_blocks"], merged["att_layer_num"])
    return ParaformerDecoderConfig(**merged)


@dataclass(frozen=True)
class SeacoParaformerConfig(ParaformerConfig):
    inner_dim: int = 256  # the hotword embeddings' width: the bias encoder's and the seaco decoder's
    seaco_decoder: ParaformerDecoderConfig = field(default_factory=lambda: seaco_decoder_config(None))
    no_bias_id: int = 8377  # FunASR's NO_BIAS: the hotword head's class for "no hotword at this position"
    hotword_spelling: HotwordSpelling | None = None  # None: hotwords refused (a model built without a token list)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.inner_dim != self.encoder.output_size:
            raise ValueError(f"inner_dim {self.inner_dim} differs from the encoder's output_size "
                             f"{self.encoder.output_size} (the seaco decoder reads the decoder's positions)")
        if not 0 <= self.no_bias_id < self.vocab_size:
            raise ValueError(f"NO_BIAS {self.no_bias_id} is not a token id (vocab_size {self.vocab_size})")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> SeacoParaformerConfig:
        base = ParaformerConfig.from_dict(values)
        model_conf = values.get("model_conf") or {}
        spelling = values.get("hotword_spelling")
        return cls(
            **{f.name: getattr(base, f.name) for f in dataclasses.fields(ParaformerConfig)},
            inner_dim=int(model_conf.get("inner_dim", 256)),  # FunASR's default when model_conf names none
            seaco_decoder=seaco_decoder_config(values.get("seaco_decoder_conf")),
            no_bias_id=int(model_conf.get("NO_BIAS", 8377)),
            hotword_spelling=HotwordSpelling.from_dict(spelling) if spelling else None,
        )

    def to_dict(self) -> dict[str, Any]:
        values = super().to_dict()
        values["model_conf"].update(inner_dim=self.inner_dim, NO_BIAS=self.no_bias_id)
        values["seaco_decoder_conf"] = dataclasses.asdict(self.seaco_decoder)
        if self.hotword_spelling is not None:
            values["hotword_spelling"] = self.hotword_spelling.to_dict()
        return values


def tiny_config() -> SeacoParaformerConfig:
    tokens = ("<blank>", "<s>", "</s>", *"abcdefghijklmnopqrstuvwxyz", "<unk>", "x1", "x2")
    return SeacoParaformerConfig(
        vocab_size=len(tokens),
        encoder=SANMEncoderConfig(output_size=32, attention_heads=4, linear_units=48, num_blocks=2),
        decoder=ParaformerDecoderConfig(attention_heads=4, linear_units=48, num_blocks=2, att_layer_num=1),
        predictor=CifPredictorConfig(idim=32),
        inner_dim=32,
        seaco_decoder=seaco_decoder_config({"linear_units": 48, "num_blocks": 1, "att_layer_num": 2,
                                            "kernel_size": 11}),
        no_bias_id=len(tokens) - 3,
        hotword_spelling=HotwordSpelling(tokens),
    )
