"""Beam search as transformers' ``generate(num_beams=K)`` runs it (its defaults: ``length_penalty=1.0``,
``early_stopping=False``), for the families whose reference is transformers (Canary, Cohere Transcribe).

It differs from openai-whisper's search (``oasr.decode.aed_beam``) in three rules:

- which hypotheses end: of the 2K likeliest continuations over all live beams, an end-of-text among the first K
  ends a hypothesis (openai-whisper: any ranked before the K-th live continuation);
- how they rank: summed log-probability divided by the generated length, end-of-text included, to the power
  ``length_penalty``; the K best are kept, whenever they ended;
- when the search stops: once K have ended and the best live beam, divided by its length so far, can no longer
  beat the worst of them; or at the token budget, where the K likeliest continuations of the last step end as
  they are.

The live beams are the same under both rules (the K likeliest continuations that do not end), so the device half
reuses ``AEDBeam``'s selection with only the ended rule changed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch

from oasr.decode import DECODE_STRATEGIES
from oasr.decode.aed_beam import AEDBeam, BeamCandidates, Hypothesis
from oasr.types import DecodeOptions


@DECODE_STRATEGIES.register("hf_beam")
class TransformersBeam(AEDBeam):
    runner: ClassVar[str] = "autoregressive"
    searches: ClassVar[bool] = True

    @staticmethod
    def candidates_for(options: DecodeOptions) -> TransformersBeamCandidates:
        if options.beam_size is None:
            raise ValueError("these options decode greedily: no beam_size")
        return TransformersBeamCandidates(options.beam_size, options.length_penalty)

    @staticmethod
    def ended(ends: torch.Tensor, live_so_far: torch.Tensor, k: int) -> torch.Tensor:
        """An end-of-text proposal ends a hypothesis only among the first K proposals (transformers' rule); the
        live beams and the rest of ``AEDBeam.select`` are the same."""
        rank = torch.arange(ends.shape[1], device=ends.device)[None, :]
        return ends & (rank < k)


class TransformersBeamCandidates(BeamCandidates):
    """The K best ended hypotheses by ``sum_logprob / generated_length ** length_penalty`` (end-of-text counted
    in the length)."""

    def __init__(self, beam_size: int, length_penalty: float | None = None) -> None:
        super().__init__(beam_size)
        self.length_penalty = 1.0 if length_penalty is None else length_penalty
        self._finished_scores: list[float] = []  # normalised scores of the hypotheses planned so far

    def _normalised(self, score: float, length: int) -> float:
        return score / length**self.length_penalty

    def plan(self, ended: list[list[tuple[int, float]]], best_live: list[float], num_generated: int,
             max_new_tokens: int) -> tuple[list[tuple[int, int, float]], int | None]:
        taken: list[tuple[int, int, float]] = []
        for step, row in enumerate(ended):
            length = num_generated + step + 1  # generated tokens once this step's are in, end-of-text included
            for slot, score in row:
                normalised = self._normalised(score, length)
                if len(self._finished_scores) < self.beam_size or normalised > min(self._finished_scores):
                    taken.append((step, slot, score))
                    self._finished_scores = sorted([*self._finished_scores, normalised], reverse=True)
                    self._finished_scores = self._finished_scores[: self.beam_size]
            if length >= max_new_tokens:
                return taken, step
            full = len(self._finished_scores) >= self.beam_size
            if full and self._normalised(best_live[step], length) <= min(self._finished_scores):
                return taken, step
        return taken, None

    def wants_live(self, num_taken: int) -> bool:
        return True  # at the budget the last step's live continuations end as they are; dominated ones lose

    def add(self, ended: Sequence[Hypothesis]) -> None:
        self.ended.extend(ended)

    def best(self, live: Sequence[Hypothesis] = ()) -> Hypothesis:
        pool = [*self.ended, *live]
        if not pool:
            raise ValueError("no hypothesis to rank: the search neither ended nor has live beams")
        return max(pool, key=self.score)

    def score(self, hypothesis: Hypothesis) -> float:
        length = len(hypothesis.token_ids) + (1 if hypothesis.ended else 0)
        return self._normalised(hypothesis.sum_logprob, max(length, 1))
