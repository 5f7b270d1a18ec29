"""Nemotron 3.5 ASR configuration. Field names follow transformers' ``Nemotron3_5AsrConfig`` (its encoder is
``NemotronAsrStreamingEncoderConfig``, the same class transformers reuses), so a ``config.json`` written by
``save_pretrained`` loads as is. ``prompt_dictionary`` is the processor's (``processor_config.json``), which the
converter merges in; without one, NeMo's default table.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from oasr.models.nemotron3_5.prompts import DEFAULT_PROMPT_DICTIONARY
from oasr.models.nemotron_streaming.config import NemotronAsrStreamingConfig, tiny_config as tiny_streaming_config


def _default_prompt_dictionary() -> dict[str, int]:
    return dict(DEFAULT_PROMPT_DICTIONARY)


@dataclass(frozen=True)
class Nemotron3_5AsrConfig(NemotronAsrStreamingConfig):
    vocab_size: int = 13088  # joint token outputs, including the blank
    blank_token_id: int = 13087  # the last vocabulary entry (NeMo's convention)
    pad_token_id: int | None = 0
    num_prompts: int = 128  # width of the one-hot prompt concatenated to every encoder frame
    prompt_intermediate_size: int = 2048  # hidden width of the prompt fusion MLP
    # The prompt of a request that names no language: NeMo's "auto" slot (the model detects the language).
    default_prompt_id: int = 101
    # Language string -> prompt index; read-only once built (the model looks requests up in it).
    prompt_dictionary: dict[str, int] = dataclasses.field(default_factory=_default_prompt_dictionary)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_prompts < 1 or self.prompt_intermediate_size < 1:
            raise ValueError(f"num_prompts ({self.num_prompts}) and prompt_intermediate_size "
                             f"({self.prompt_intermediate_size}) must be at least 1")
        outside = {k: v for k, v in self.prompt_dictionary.items() if not 0 <= v < self.num_prompts}
        if not 0 <= self.default_prompt_id < self.num_prompts or outside:
            raise ValueError(f"prompt ids must lie in [0, {self.num_prompts}): default_prompt_id "
                             f"{self.default_prompt_id}, prompt_dictionary entries {outside or 'all inside'}")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Nemotron3_5AsrConfig:
        kwargs = dict(values)
        if kwargs.get("prompt_dictionary") is not None:
            kwargs["prompt_dictionary"] = {str(k): int(v) for k, v in kwargs["prompt_dictionary"].items()}
        return super().from_dict(kwargs)

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "model_type": "nemotron3_5_asr"}


def tiny_config() -> Nemotron3_5AsrConfig:
    """Nemotron ASR streaming's tiny model plus a narrow prompt MLP. ``num_prompts`` stays the real 128 so the
    default table (indices up to 104) and its "auto" slot are valid as they are."""
    base = tiny_streaming_config()
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
    return Nemotron3_5AsrConfig(**fields, prompt_intermediate_size=64)
