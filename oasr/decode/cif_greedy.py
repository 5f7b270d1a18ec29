"""Greedy decoding of a non-autoregressive CIF model (Paraformer): the decoder scores every token position the
predictor fired in one pass, and each position takes its best token; whole batch, one host read.

Model contract (architectures listing it in their capabilities): ``cif_logits(hidden [B, T, D], lengths [B])
-> (logits [B, L, V], token_counts [B])`` and ``dropped_ids``, the ids a hypothesis never keeps (FunASR drops
blank, <s> and </s> from the decoder's best tokens).
"""

from __future__ import annotations

from typing import ClassVar, Protocol

import torch

from oasr.decode import DECODE_STRATEGIES
from oasr.decode.base import DecodeStrategy, EncoderOutput
from oasr.decode.pending import CopiedTokens


class CifModel(Protocol):
    dropped_ids: tuple[int, ...]

    def cif_logits(self, hidden: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...


def best_tokens(logits: torch.Tensor, token_counts: torch.Tensor, dropped_ids: tuple[int, ...]
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """logits: [B, L, V]; token_counts: [B] -> (labels int32 [B, L], keep bool [B, L]): each position's best
    token, kept when it lies inside its row's count and is not one of ``dropped_ids``."""
    labels = logits.argmax(dim=-1)
    keep = torch.arange(labels.shape[1], device=labels.device)[None, :] < token_counts.to(labels.device)[:, None]
    for token in dropped_ids:
        keep &= labels != token
    return labels.int(), keep


def _kept_labels(labels: torch.Tensor, keep: torch.Tensor) -> list[list[int]]:
    return [row[mask].tolist() for row, mask in zip(labels, keep, strict=True)]


@DECODE_STRATEGIES.register("cif_greedy")
class CifGreedy(DecodeStrategy):
    runner: ClassVar[str] = "frame_sync"
    searches: ClassVar[bool] = False

    def decode(self, model: CifModel, encoder_output: EncoderOutput) -> list[list[int]]:
        """encoder_output: hidden [B, T, D], lengths [B] -> token ids per row."""
        return self.launch(model, encoder_output).wait()

    def launch(self, model: CifModel, encoder_output: EncoderOutput) -> CopiedTokens:
        """``decode`` with the result still on its way to the host."""
        logits, token_counts = model.cif_logits(encoder_output.hidden, encoder_output.lengths)
        return CopiedTokens(best_tokens(logits, token_counts, model.dropped_ids), _kept_labels)
