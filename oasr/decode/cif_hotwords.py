"""Greedy CIF decoding steered by hotwords (SeACo-Paraformer): the model scores every fired position once with
its hotword path and each position takes its best token, as ``cif_greedy`` does without hotwords.

The frame-synchronous runner reaches it as the architecture's searching strategy: a request gives hotwords alone
(they bias the network, not a search: ``biases_greedy``) or with ``beam_size`` 1 (the widest it serves), and the
runner launches it once per distinct hotword list over the rows that asked for that list.

Model contract: ``cif_logits`` and ``dropped_ids`` (``oasr.decode.cif_greedy``) plus
``cif_logits_biased(hidden [B, T, D], lengths [B], hotwords) -> (scores [B, L, V], token_counts [B])``, every row
biased by the same list.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Protocol

import torch

from oasr.decode import DECODE_STRATEGIES
from oasr.decode.base import DecodeStrategy, EncoderOutput
from oasr.decode.cif_greedy import CifModel, _kept_labels, best_tokens
from oasr.decode.pending import CopiedTokens
from oasr.types import Hotword


class BiasedCifModel(CifModel, Protocol):
    def cif_logits_biased(self, hidden: torch.Tensor, lengths: torch.Tensor, hotwords: Sequence[Hotword]
                          ) -> tuple[torch.Tensor, torch.Tensor]: ...


@DECODE_STRATEGIES.register("cif_hotwords")
class CifHotwords(DecodeStrategy):
    runner: ClassVar[str] = "frame_sync"
    searches: ClassVar[bool] = True  # serves beam_size, of 1 only
    biases: ClassVar[bool] = True
    biases_greedy: ClassVar[bool] = True
    widest_beam: ClassVar[int | None] = 1

    def __init__(self, hotwords: tuple[Hotword, ...] = ()) -> None:
        self.hotwords = hotwords

    @classmethod
    def for_beam(cls, beam_size: int, hotwords: tuple = (), contexts=None) -> CifHotwords:
        return cls(tuple(hotwords))

    def decode(self, model: BiasedCifModel, encoder_output: EncoderOutput) -> list[list[int]]:
        return self.launch(model, encoder_output).wait()

    def launch(self, model: BiasedCifModel, encoder_output: EncoderOutput) -> CopiedTokens:
        hidden, lengths = encoder_output.hidden, encoder_output.lengths
        if self.hotwords:
            scores, token_counts = model.cif_logits_biased(hidden, lengths, self.hotwords)
        else:
            scores, token_counts = model.cif_logits(hidden, lengths)
        return CopiedTokens(best_tokens(scores, token_counts, model.dropped_ids), _kept_labels)
