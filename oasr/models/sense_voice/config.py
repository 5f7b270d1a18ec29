"""SenseVoice-Small's configuration, read from FunASR's ``config.yaml`` (``encoder_conf``, ``frontend_conf``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from oasr.features.funasr_fbank import FunasrFbankConfig
from oasr.models.paraformer.config import SANMEncoderConfig, known_fields

# The rows of ``embed`` each query reads (FunASR's ``lid_dict`` and ``textnorm_dict``; rows 1 and 2 are the event
# and emotion queries, always the same). A language absent here is refused; None and "auto" detect.
LANGUAGE_ROWS = {"auto": 0, "zh": 3, "en": 4, "yue": 7, "ja": 11, "ko": 12, "nospeech": 13}
EVENT_EMOTION_ROWS = (1, 2)
ITN_ROWS = {True: 14, False: 15}  # withitn, woitn
NUM_QUERY_ROWS = 7 + len(LANGUAGE_ROWS) + len(ITN_ROWS)
NUM_QUERIES = 4  # language, event, emotion, ITN: the frames prepended to the input


@dataclass(frozen=True)
class SenseVoiceEncoderConfig(SANMEncoderConfig):
    """``SenseVoiceEncoderSmall``: the SANM encoder, then ``tp_blocks`` more layers and ``tp_norm``."""

    tp_blocks: int = 20


@dataclass(frozen=True)
class SenseVoiceConfig:
    vocab_size: int
    encoder: SenseVoiceEncoderConfig = field(default_factory=SenseVoiceEncoderConfig)
    frontend: FunasrFbankConfig = field(default_factory=FunasrFbankConfig)
    blank_id: int = 0
    # The ids of the tag pieces of its SentencePiece model (``<|en|>``, ``<|HAPPY|>``, ``<|Speech|>`` ...), read
    # by the converter: how a language the model found is reported.
    tag_token_ids: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.encoder.input_size != self.frontend.feature_size:
            raise ValueError(f"the encoder reads {self.encoder.input_size}-wide frames but the frontend stacks "
                             f"{self.frontend.feature_size} (n_mels * lfr_m)")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> SenseVoiceConfig:
        encoder = {"input_size": values.get("input_size", 560), **(values.get("encoder_conf") or {})}
        model = values.get("model_conf") or {}
        return cls(vocab_size=int(values["vocab_size"]),
                   encoder=SenseVoiceEncoderConfig(**known_fields(SenseVoiceEncoderConfig, encoder)),
                   frontend=FunasrFbankConfig.from_dict(values.get("frontend_conf") or {}),
                   blank_id=int(model.get("blank_id", 0)),
                   tag_token_ids={str(k): int(v) for k, v in (values.get("tag_token_ids") or {}).items()})

    def to_dict(self) -> dict[str, Any]:
        frontend = self.frontend
        return {"vocab_size": self.vocab_size, "input_size": self.encoder.input_size,
                "tag_token_ids": dict(self.tag_token_ids),
                "encoder_conf": dataclasses.asdict(self.encoder), "model_conf": {"blank_id": self.blank_id},
                "frontend_conf": {"fs": frontend.sample_rate, "n_mels": frontend.num_mel_bins,
                                  "frame_length": frontend.frame_length_ms, "frame_shift": frontend.frame_shift_ms,
                                  "window": frontend.window, "lfr_m": frontend.lfr_m, "lfr_n": frontend.lfr_n,
                                  "cmvn_shift": list(frontend.cmvn_shift), "cmvn_scale": list(frontend.cmvn_scale)}}


def tiny_config() -> SenseVoiceConfig:
    return SenseVoiceConfig(vocab_size=40, encoder=SenseVoiceEncoderConfig(output_size=32, attention_heads=4,
                                                                          linear_units=48, num_blocks=2, tp_blocks=1))
