"""The CT-Transformer's configuration, read from FunASR's ``config.yaml`` under FunASR's own field names: the model's
widths and punctuation list (``model_conf``) and its SANM encoder (``encoder_conf``). Training-only fields (dropout,
loss weights) are read past; a value the modules are not built for is refused naming the field."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from oasr.errors import CheckpointError
from oasr.models.paraformer.config import SANMEncoderConfig, known_fields

# Config values OASR's modules serve: another value is refused naming the field (a field left out takes FunASR's
# default, which is the value here).
REQUIRED: dict[str, Any] = {
    "encoder": "SANMEncoder",
    "encoder_conf.input_layer": "pe",
    "encoder_conf.selfattention_layer_type": "sanm",
    "encoder_conf.positionwise_layer_type": "linear",
    "encoder_conf.normalize_before": True,
    "encoder_conf.concat_after": False,
}
# FunASR's punctuation marks the inference reads by value: a sentence ends at "。" or "？", a long run without one
# is cut at "，", and "_" is no punctuation.
NO_MARK = "_"


@dataclass(frozen=True)
class CTPuncConfig:
    punc_list: tuple[str, ...]  # the classifier's rows: id -> the mark written after a word
    sentence_end_id: int  # the mark a cut at a comma, or the text's end, is turned into
    embed_unit: int
    att_unit: int
    encoder: SANMEncoderConfig

    def __post_init__(self) -> None:
        if NO_MARK not in self.punc_list:
            raise CheckpointError(f"model_conf.punc_list {list(self.punc_list)} has no {NO_MARK!r} (no punctuation)")
        if not 0 <= self.sentence_end_id < len(self.punc_list):
            raise CheckpointError(f"model_conf.sentence_end_id {self.sentence_end_id} is not an index of punc_list")
        if self.embed_unit != self.encoder.input_size or self.att_unit != self.encoder.output_size:
            raise CheckpointError(f"model_conf.embed_unit/att_unit ({self.embed_unit}, {self.att_unit}) differ from "
                                  f"encoder_conf.input_size/output_size ({self.encoder.input_size}, "
                                  f"{self.encoder.output_size})")


def check_fields(config: dict[str, Any], where: str) -> None:
    """Refuses a config this package cannot run, naming the field."""
    if config.get("model") != "CTTransformer":
        raise CheckpointError(f"{where}: config.yaml field model is {config.get('model')!r}; a punctuation folder is "
                              "FunASR's CTTransformer")
    for path, required in REQUIRED.items():
        section, _, name = path.partition(".")
        value = (config.get(section) or {}).get(name, required) if name else config.get(section)
        if value != required:
            raise CheckpointError(f"{where}: config.yaml field {path} is {value!r}; OASR serves {required!r}")
    # Word-level checkpoints segment Chinese with jieba and a user dictionary; OASR reads character-level ones.
    places = {"jieba_usr_dict": config, **{f"{s}.jieba_usr_dict": config.get(s) or {} for s in ("model_conf",
                                                                                                "tokenizer_conf")}}
    for path, section in places.items():
        if section.get("jieba_usr_dict") is not None:
            raise CheckpointError(f"{where}: config.yaml field {path} is set; OASR serves character-level "
                                  "CT-Transformers (no jieba word segmentation)")


def read_config(config: dict[str, Any], where: str) -> CTPuncConfig:
    check_fields(config, where)
    model = config.get("model_conf") or {}
    encoder = config.get("encoder_conf") or {}
    try:
        punc_list = tuple(str(p) for p in model["punc_list"])
        embed_unit = int(model.get("embed_unit", 128))
        encoder_config = SANMEncoderConfig(**{"input_size": embed_unit, **known_fields(SANMEncoderConfig, encoder)})
        return CTPuncConfig(punc_list=punc_list, sentence_end_id=int(model.get("sentence_end_id", 3)),
                            embed_unit=embed_unit, att_unit=int(model.get("att_unit", 256)), encoder=encoder_config)
    except KeyError as exc:
        raise CheckpointError(f"{where}: config.yaml has no model_conf.{exc.args[0]}") from None
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{where}: config.yaml: {exc}") from None
