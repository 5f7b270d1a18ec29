"""CTC prefix beam search, then attention rescoring (WeNet's ``attention_rescoring``, the U2++ two-pass decode).

The first pass is the CTC prefix beam search of ``oasr.decode.ctc_prefix_beam`` kept whole: its ``beam_size``
beams, each a label prefix with its CTC score. The model's attention decoder then scores every beam teacher-forced
(``rescore``: the log-probability of its tokens and of ``</s>`` given the encoder frames), and the hypothesis with
the highest

    weight * attention + (1 - weight) * ctc

wins. ``weight`` 0 keeps the CTC ranking (the prefix beam's own best); 1 ranks by the decoder alone. WeNet writes
the same ranking as ``attention + ctc_weight * ctc``, which is ``weight = 1 / (1 + ctc_weight)`` here; the default
0.5 weighs the two as FunASR's joint decoding does by default (``decoding_ctc_weight`` 0.5).

Model contract: the CTC pair (``ctc_log_probs``, ``blank_id``) and ``rescore(encoder_output, hypotheses) ->
[B, K]`` (``RescoringModel``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch

from oasr.decode import DECODE_STRATEGIES
from oasr.decode.base import DecodeStrategy, EncoderOutput
from oasr.decode.ctc_greedy import CTCModel
from oasr.decode.ctc_prefix_beam import run_prefix_beams
from oasr.decode.pending import LaunchesEagerly

DEFAULT_RESCORE_WEIGHT = 0.5


class RescoringModel(CTCModel, Protocol):
    def rescore(self, encoder_output: EncoderOutput, hypotheses: Sequence[Sequence[Sequence[int]]]) -> torch.Tensor:
        """Per row, K token-id lists -> the attention decoder's log-probability of each, [B, K]."""
        ...


@dataclass(frozen=True)
class RescoreOptions:
    beam_size: int = 4  # the n-best the CTC pass proposes
    weight: float = DEFAULT_RESCORE_WEIGHT  # the attention score's share of the combined score

    def __post_init__(self) -> None:
        if self.beam_size < 1:
            raise ValueError(f"beam_size must be at least 1, got {self.beam_size}")
        if not 0.0 <= self.weight <= 1.0:
            raise ValueError(f"the rescoring weight must lie in [0, 1], got {self.weight}")


def prefix_beam_nbest(log_probs: torch.Tensor, lengths: torch.Tensor, blank_id: int,
                      beam_size: int) -> tuple[list[list[list[int]]], torch.Tensor]:
    """log_probs: [B, T, V]; lengths: [B] -> (per row, the K = beam_size prefixes the search ends with; their CTC
    scores [B, K], -inf for a beam that never came alive, as on inputs with fewer than K distinct prefixes).

    The same search as ``prefix_beam_search`` (no hotwords), read back whole: one host sync for the batch.
    """
    b, t, _ = log_probs.shape
    device = log_probs.device
    beams, parents, labels = run_prefix_beams(log_probs, lengths, blank_id, beam_size)
    stay_put = torch.arange(beam_size, device=device).expand(b, beam_size)
    rows = torch.arange(b, device=device)[:, None]
    beam = stay_put.clone()
    path = torch.empty(t, b, beam_size, dtype=torch.long, device=device)
    for frame_index in reversed(range(t)):
        path[frame_index] = labels[frame_index, rows, beam]
        beam = parents[frame_index, rows, beam]
    path = path.permute(1, 2, 0).cpu()  # [B, K, T], the one host sync
    return [[seq[seq >= 0].tolist() for seq in row] for row in path], beams.total


def combined_scores(ctc_scores: torch.Tensor, attention_scores: torch.Tensor, weight: float) -> torch.Tensor:
    """[B, K] each -> weight * attention + (1 - weight) * ctc; a dead beam (CTC score -inf) stays -inf."""
    combined = weight * attention_scores.float() + (1.0 - weight) * ctc_scores.float()
    return torch.where(torch.isneginf(ctc_scores), float("-inf"), combined)


def rescore_nbest(model: RescoringModel, encoder_output: EncoderOutput,
                  options: RescoreOptions) -> tuple[list[list[int]], list[list[list[int]]], torch.Tensor]:
    """-> (the best hypothesis per row, the n-best per row, their combined scores [B, K])."""
    log_probs = model.ctc_log_probs(encoder_output.hidden)
    nbest, ctc_scores = prefix_beam_nbest(log_probs, encoder_output.lengths, model.blank_id, options.beam_size)
    scores = combined_scores(ctc_scores, model.rescore(encoder_output, nbest), options.weight)
    best = scores.argmax(dim=1).tolist()
    return [row[k] for row, k in zip(nbest, best, strict=True)], nbest, scores


@DECODE_STRATEGIES.register("ctc_attention_rescore")
class CTCAttentionRescore(LaunchesEagerly, DecodeStrategy):
    runner: ClassVar[str] = "frame_sync"  # the runner kind that drives it
    searches: ClassVar[bool] = True  # serves DecodeOptions.beam_size: the n-best the decoder rescores
    rescores: ClassVar[bool] = True  # and DecodeOptions.rescore_weight

    def __init__(self, options: RescoreOptions | None = None) -> None:
        self.options = options or RescoreOptions()

    @classmethod
    def for_beam(cls, beam_size: int, hotwords: tuple = (), contexts=None) -> CTCAttentionRescore:
        if hotwords:  # the runner refuses them first: this strategy does not declare ``biases``
            raise ValueError("attention rescoring takes no hotwords")
        return cls(RescoreOptions(beam_size=beam_size))

    @classmethod
    def for_rescoring(cls, beam_size: int, weight: float) -> CTCAttentionRescore:
        return cls(RescoreOptions(beam_size=beam_size, weight=weight))

    def decode(self, model: RescoringModel, encoder_output: EncoderOutput) -> list[list[int]]:
        """encoder_output: hidden [B, T, D], lengths [B] -> the best rescored hypothesis per row."""
        best, _, _ = rescore_nbest(model, encoder_output, self.options)
        return best
