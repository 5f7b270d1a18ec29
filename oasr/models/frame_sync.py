"""The base of the frame-synchronous architectures (CTC, RNN-T, TDT): what every runner that serves them calls
beside ``encode``, declared here once with its default so that no runner probes a model for it.

Prompt conditioning: a model may condition its encoder output on a per-request prompt (Nemotron 3.5's language).
A runner asks ``prompt_id(options)`` once per request (on the host; it raises ``UnsupportedOptionError`` for a
value the checkpoint cannot serve, so runners call it in their option check too) and passes the rows' ids to
``fuse_prompt`` on the encoder's output: whole files after ``encode``, a streaming runtime on each chunk's frames.
Frame-wise, so a chunk fuses exactly as the whole file would. The defaults condition on nothing.

``output_language(language, token_ids)`` is the language a finished request is reported in: by default the one
asked for; a model that writes the language it found (SenseVoice's ``<|en|>``) reads it from its tokens.

A model whose prompt conditions the encoder's *input* (SenseVoice prepends query embeddings for language and
text normalisation to its frames) overrides ``encode_prompted``, which the runner calls for whole files; by
default it is ``encode`` then ``fuse_prompt``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from oasr.decode.base import EncoderOutput
from oasr.types import DecodeOptions


class FrameSyncModel(nn.Module):
    def prompt_id(self, options: DecodeOptions) -> int | None:
        """The prompt a request with ``options`` is encoded under, or None for a model without prompts."""
        return None

    def fuse_prompt(self, hidden: torch.Tensor, prompt_ids: torch.Tensor | None) -> torch.Tensor:
        """hidden: [B, T, D] encoder frames; prompt_ids: int64 [B] (on hidden's device) or None (the model's
        default prompt) -> the frames the heads read, [B, T, D]."""
        return hidden

    def encode_prompted(self, features: torch.Tensor, lengths: torch.Tensor,
                        prompt_ids: torch.Tensor | None) -> EncoderOutput:
        """Whole inputs under their prompts: features and lengths as ``encode`` takes them, prompt_ids: int64 [B]
        or None -> the frames the heads read, with their lengths."""
        encoded = self.encode(features, lengths)  # type: ignore[attr-defined]
        return EncoderOutput(self.fuse_prompt(encoded.hidden, prompt_ids), encoded.lengths)

    def output_language(self, language: str | None, token_ids: Sequence[int]) -> str | None:
        """The language a finished request is reported in (``language``: the one it asked for, or None)."""
        return language
