"""Beam search for attention encoder-decoders, as openai-whisper's ``BeamSearchDecoder`` and
``MaximumLikelihoodRanker`` define it, in two halves:

- ``AEDBeam.select`` runs on the device for many requests at once, in one fixed-shape pass without host syncs:
  from the filtered log-probabilities of each request's live beams it picks the next live beams and the
  hypotheses that end at this step.
- ``BeamCandidates`` lives on the host, one per request: the ended hypotheses in the order they ended, the
  patience rule that ends the search, and the ranking that picks the result.

One step for a request of beam size K whose live beams are b_1 .. b_R (R = K; R = 1 at the first step, where all
K rows would hold the same prompt): each beam proposes its K + 1 likeliest next tokens, scored by the beam's
summed log-probability plus the token's. Proposals are walked best first (ties keep beam order, then token
rank, like openai-whisper's stable sort over its insertion order). A proposal ending in end-of-text is an ended
hypothesis; any other becomes the next live beam, until K live beams are found; ended proposals ranked below
the K-th live beam are dropped. K + 1 proposals per beam because at most one of them can end, which leaves K
live ones. Summed log-probabilities stay float32, as openai-whisper keeps them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch

from oasr.decode import DECODE_STRATEGIES
from oasr.decode.base import DecodeStrategy
from oasr.types import DecodeOptions


@dataclass(frozen=True)
class BeamChoice:
    """One step of G requests of beam size K, from R live beams each. Indices into the R beams, best first."""

    source: torch.Tensor  # int64 [G, K]: which live beam each next beam extends
    tokens: torch.Tensor  # int64 [G, K]: the token it appends
    scores: torch.Tensor  # float32 [G, K]: its summed log-probability
    ended_source: torch.Tensor  # int64 [G, R]: beams whose end-of-text proposal ended a hypothesis, best first
    ended_scores: torch.Tensor  # float32 [G, R]: those hypotheses' summed log-probabilities; NaN past the last


@DECODE_STRATEGIES.register("aed_beam")
class AEDBeam(DecodeStrategy):
    runner: ClassVar[str] = "autoregressive"  # the runner kind that drives it
    searches: ClassVar[bool] = True  # serves DecodeOptions.beam_size
    biases: ClassVar[bool] = True  # and its hotwords (the runner's BeamRows adds their gains before ``select``)

    def __init__(self, eot: int) -> None:
        self.eot = eot

    @staticmethod
    def candidates_for(options: DecodeOptions) -> BeamCandidates:
        """The host half of one request's search."""
        return BeamCandidates.for_options(options)

    def select(self, logprobs: torch.Tensor, scores: torch.Tensor, beam_size: int) -> BeamChoice:
        """logprobs: float32 [G, R, vocab], log-softmax of the filtered logits of each request's live beams;
        scores: float32 [G, R], the beams' summed log-probabilities -> the step's ``BeamChoice``."""
        k = beam_size
        top_logprobs, top_tokens = logprobs.topk(k + 1, dim=-1)  # [G, R, K + 1]
        proposals = (scores[..., None] + top_logprobs).flatten(1)  # [G, R * (K + 1)], beam-major
        order = proposals.argsort(dim=1, descending=True, stable=True)
        ranked = proposals.gather(1, order)
        tokens = top_tokens.flatten(1).gather(1, order)
        source = order // (k + 1)
        ends = tokens == self.eot
        live_so_far = (~ends).cumsum(dim=1)  # live proposals up to and including each one
        live = ~ends & (live_so_far <= k)
        ended = self.ended(ends, live_so_far, k)
        # A stable sort on "not picked" moves the picked proposals to the front, still best first.
        picked = (~live).to(torch.uint8).argsort(dim=1, stable=True)[:, :k]
        num_beams = logprobs.shape[1]
        ended_at = (~ended).to(torch.uint8).argsort(dim=1, stable=True)[:, :num_beams]
        ended_scores = torch.where(ended.gather(1, ended_at), ranked.gather(1, ended_at), float("nan"))
        return BeamChoice(
            source=source.gather(1, picked),
            tokens=tokens.gather(1, picked),
            scores=ranked.gather(1, picked),
            ended_source=source.gather(1, ended_at),
            ended_scores=ended_scores,
        )


    @staticmethod
    def ended(ends: torch.Tensor, live_so_far: torch.Tensor, k: int) -> torch.Tensor:
        """Which end-of-text proposals end a hypothesis (bool [G, P], proposals best first): openai-whisper's rule,
        those ranked before the K-th live proposal."""
        return ends & (live_so_far < k)


@dataclass(frozen=True)
class Hypothesis:
    token_ids: tuple[int, ...]  # generated tokens, end-of-text excluded
    sum_logprob: float  # of the tokens, and of end-of-text when it ended with one
    ended: bool = True  # False: a live beam cut at the token budget


class BeamCandidates:
    """One request's ended hypotheses. The search ends once ``round(beam_size * patience)`` have ended; a search
    cut at its token budget with fewer than ``beam_size`` adds its likeliest live beams. The result is the
    hypothesis with the best ``sum_logprob / penalty``: penalty = its length (``length_penalty`` None), or
    ``((5 + length) / 6) ** length_penalty`` (Google NMT's, as openai-whisper uses it); the first wins a tie."""

    def __init__(self, beam_size: int, patience: float | None = None, length_penalty: float | None = None) -> None:
        self.beam_size = beam_size
        self.length_penalty = length_penalty
        self.max_candidates = round(beam_size * (patience or 1.0))
        self.ended: list[Hypothesis] = []

    @classmethod
    def for_options(cls, options: DecodeOptions) -> BeamCandidates:
        if options.beam_size is None:
            raise ValueError("these options decode greedily: no beam_size")
        return cls(options.beam_size, options.patience, options.length_penalty)

    @property
    def complete(self) -> bool:
        return len(self.ended) >= self.max_candidates

    @property
    def num_wanted(self) -> int:
        """How many more ended hypotheses the search takes."""
        return max(self.max_candidates - len(self.ended), 0)

    def plan(self, ended: list[list[tuple[int, float]]], best_live: list[float], num_generated: int,
             max_new_tokens: int) -> tuple[list[tuple[int, int, float]], int | None]:
        """From one search's staged steps (per step: the (slot, summed log-probability) of each hypothesis that
        ended there, best first; and its best live beam's score): the hypotheses it takes as (step, slot, score)
        and the step it ends at (None: it goes on). openai-whisper's rule: the first ``max_candidates`` to end."""
        taken: list[tuple[int, int, float]] = []
        wanted = self.num_wanted
        for step, row in enumerate(ended):
            taken += [(step, slot, score) for slot, score in row[:wanted]]
            wanted -= len(row[:wanted])
            if wanted == 0 or num_generated + step + 1 >= max_new_tokens:
                return taken, step
        return taken, None

    def wants_live(self, num_taken: int) -> bool:
        """Whether a search that ends with ``num_taken`` more hypotheses ranks its live beams too."""
        return len(self.ended) + num_taken < self.beam_size

    def add(self, ended: Sequence[Hypothesis]) -> None:
        """One step's ended hypotheses, best first; those past the search's quota are dropped."""
        self.ended.extend(ended[: self.num_wanted])

    def best(self, live: Sequence[Hypothesis] = ()) -> Hypothesis:
        """The result, once the search is complete or cut at its budget (then ``live``: the live beams)."""
        pool = list(self.ended)
        for beam in sorted(live, key=lambda h: h.sum_logprob, reverse=True):
            if len(pool) >= self.beam_size:
                break
            pool.append(beam)
        if not pool:
            raise ValueError("no hypothesis to rank: the search neither ended nor has live beams")
        return max(pool, key=self.score)  # max keeps the first of equal scores, as numpy's argmax does

    def score(self, hypothesis: Hypothesis) -> float:
        length = len(hypothesis.token_ids)
        if self.length_penalty is None:
            # End-of-text alone counts as length 1 where openai-whisper would divide by zero (Whisper's filters
            # forbid end-of-text as the first token, so only a checkpoint without that rule gets here).
            return hypothesis.sum_logprob / max(length, 1)
        return hypothesis.sum_logprob / ((5 + length) / 6) ** self.length_penalty
