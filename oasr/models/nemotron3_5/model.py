"""Nemotron 3.5 ASR RNN-T (transformers' ``Nemotron3_5AsrForRNNT``), served whole-file.

Nemotron ASR streaming (``oasr.models.nemotron_streaming``) with one module more: ``prompt_projector``
(``linear_1`` over [encoder frame, one_hot(prompt id)] -> ReLU -> ``linear_2`` back to the encoder width), applied
to every encoder frame before ``encoder_projector``. The prompt id names the language to transcribe (or "auto");
it comes from ``DecodeOptions.language`` through ``prompt_id`` and reaches the frames through ``fuse_prompt``,
the seam every frame-synchronous runner calls (``oasr.models.frame_sync``).
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from oasr.errors import UnsupportedOptionError
from oasr.layers import Linear, ReLU
from oasr.models import ARCHITECTURES
from oasr.models.capabilities import ModelCapabilities
from oasr.models.nemotron3_5.config import Nemotron3_5AsrConfig, tiny_config
from oasr.models.nemotron_streaming.model import NemotronAsrStreamingForRNNT
from oasr.types import DecodeOptions


class PromptProjector(nn.Module):
    """[B, T, hidden + num_prompts] -> [B, T, hidden]; keys as transformers' ``Nemotron3_5AsrPromptProjector``."""

    def __init__(self, config: Nemotron3_5AsrConfig) -> None:
        super().__init__()
        hidden = config.encoder_config.hidden_size
        self.linear_1 = Linear(hidden + config.num_prompts, config.prompt_intermediate_size)
        self.act = ReLU()
        self.linear_2 = Linear(config.prompt_intermediate_size, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.act(self.linear_1(x)))


@ARCHITECTURES.register("nemotron3_5_asr")
class Nemotron3_5AsrForRNNT(NemotronAsrStreamingForRNNT):
    config_class: ClassVar[type] = Nemotron3_5AsrConfig
    capabilities = ModelCapabilities(runner="frame_sync", decode_strategies=("transducer_greedy",),
                                     options=frozenset({"language"}), streaming="cache_aware")

    def __init__(self, config: Nemotron3_5AsrConfig) -> None:
        super().__init__(config)
        self.prompt_projector = PromptProjector(config)

    @staticmethod
    def tiny_config() -> Nemotron3_5AsrConfig:
        return tiny_config()

    def prompt_id(self, options: DecodeOptions) -> int:
        """The language's prompt index; no language is the checkpoint's default prompt ("auto")."""
        config = self.config
        if options.language is None:
            return config.default_prompt_id
        prompt = config.prompt_dictionary.get(options.language)
        if prompt is None:
            raise UnsupportedOptionError(f"Nemotron 3.5 ASR does not know language {options.language!r}; "
                                         f"it knows {', '.join(sorted(config.prompt_dictionary))}")
        return prompt

    def fuse_prompt(self, hidden: torch.Tensor, prompt_ids: torch.Tensor | None) -> torch.Tensor:
        """hidden: [B, T, D]; prompt_ids: int64 [B] or None (every row the default prompt) -> [B, T, D].

        As transformers' ``get_audio_features``: the one-hot prompt broadcast over time and concatenated to
        each frame, so padded frames are fused too (the heads never read them)."""
        if prompt_ids is None:
            prompt_ids = torch.full((hidden.shape[0],), self.config.default_prompt_id, device=hidden.device)
        one_hot = F.one_hot(prompt_ids, self.config.num_prompts).to(hidden.dtype)
        return self.prompt_projector(torch.cat([hidden, one_hot[:, None, :].expand(-1, hidden.shape[1], -1)], -1))
