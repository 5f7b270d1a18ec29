"""CTC prefix beam search on device tensors: batched over rows, vectorised over beams and vocabulary.

Each beam is a label prefix with two log-scores: ending in blank (``pb``) and ending in its last label (``pnb``)
(Hannun et al. 2014). Per frame, every beam either stays (blank, or a repeat of its last label) or extends by a
label; an extension that rebuilds another beam's prefix is merged into that beam. Prefixes are identified by a
pair of polynomial hashes, so merging needs no prefix comparison; the labels are recovered at the end from
per-frame back-pointers, with one host sync for the whole batch.

``beam_size = 1`` is greedy decoding by definition here (as NeMo does): a one-beam prefix search keeps the most
probable prefix, which may differ from the best-path labels that greedy decoding returns.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import torch

from oasr.decode import DECODE_STRATEGIES
from oasr.decode.back_pointers import follow_back_pointers
from oasr.decode.base import DecodeStrategy, EncoderOutput
from oasr.decode.ctc_greedy import CTCModel, greedy_ids
from oasr.decode.ctc_lexicon_beam import (DEFAULT_BEAM_SIZE_TOKEN, DEFAULT_BEAM_THRESHOLD, CTCLexiconBeam,
                                          LexiconBeamOptions, WordResources)
from oasr.types import Hotword
from oasr.decode.hotwords import ContextGraph, ContextGraphCache
from oasr.decode.pending import LaunchesEagerly

# Two hashes modulo primes below 2^31: products stay inside int64, and a false merge needs both to collide.
_HASH_MODULI = (2_147_483_647, 1_000_000_007)
_HASH_BASES = (1_000_003, 998_244_353)
# The language model's weight when a request names none: a middling value to start from; the best weight depends
# on the model and the LM, and is found on held-out speech.
DEFAULT_LM_WEIGHT = 0.5


@dataclass(frozen=True)
class CTCPrefixBeamOptions:
    beam_size: int = 4
    hotwords: tuple[Hotword, ...] = ()  # phrases to boost (``oasr.decode.hotwords``)

    def __post_init__(self) -> None:
        if self.beam_size < 1:
            raise ValueError(f"beam_size must be at least 1, got {self.beam_size}")


@dataclass
class PrefixBeams:
    """Per row and beam, [B, K]: prefix scores, last label (-1: empty prefix), prefix length; hashes [B, K, 2]
    of the prefix and of the prefix without its last label; the hotword automaton's state and the boost the
    prefix has earned (a function of the prefix, so merged beams agree on both)."""

    pb: torch.Tensor
    pnb: torch.Tensor
    last: torch.Tensor
    length: torch.Tensor
    hash: torch.Tensor
    parent_hash: torch.Tensor
    context_state: torch.Tensor
    context_score: torch.Tensor

    @classmethod
    def empty(cls, batch: int, beam: int, device: torch.device) -> PrefixBeams:
        pb = torch.full((batch, beam), float("-inf"), device=device)
        pb[:, 0] = 0.0  # one live beam: the empty prefix
        hashes = torch.zeros(batch, beam, 2, dtype=torch.long, device=device)
        return cls(
            pb=pb,
            pnb=torch.full_like(pb, float("-inf")),
            last=torch.full((batch, beam), -1, dtype=torch.long, device=device),
            length=torch.zeros(batch, beam, dtype=torch.long, device=device),
            hash=hashes,
            parent_hash=hashes - 1,  # no prefix hashes to -1: the empty prefix has no parent
            context_state=torch.zeros(batch, beam, dtype=torch.long, device=device),
            context_score=torch.zeros(batch, beam, device=device),
        )

    @property
    def total(self) -> torch.Tensor:
        return torch.logaddexp(self.pb, self.pnb)


@dataclass(frozen=True)
class PrefixConstants:
    """Made once per search, on the search's device."""

    labels: torch.Tensor  # [V]: 0 .. V-1
    hash_bases: torch.Tensor  # [2]
    hash_moduli: torch.Tensor  # [2]

    @classmethod
    def on(cls, vocab_size: int, device: torch.device) -> PrefixConstants:
        return cls(torch.arange(vocab_size, device=device), torch.tensor(_HASH_BASES, device=device),
                   torch.tensor(_HASH_MODULI, device=device))


def prefix_step(
    beams: PrefixBeams, frame: torch.Tensor, blank_id: int, const: PrefixConstants, context: ContextGraph | None = None
) -> tuple[PrefixBeams, torch.Tensor, torch.Tensor]:
    """One frame. frame: [B, V] log-probs -> (new beams, parent [B, K], appended label [B, K] or -1). With
    ``context``, beams are ranked by their score plus their hotword boost; the scores themselves stay acoustic."""
    b, k = beams.pb.shape
    v = frame.shape[1]
    total, live = beams.total, beams.total > float("-inf")
    has_last = beams.last >= 0
    last = beams.last.clamp(min=0)
    stay_pb = total + frame[:, blank_id, None]
    stay_pnb = torch.where(has_last, beams.pnb + frame.gather(1, last), float("-inf"))
    # Extending by the beam's own last label needs a blank in between: only the blank-ending mass may do it.
    repeats = const.labels[None, None, :] == beams.last[..., None]
    extend = torch.where(repeats, beams.pb[..., None], total[..., None]) + frame[:, None, :]  # [B, K, V]
    extend[..., blank_id] = float("-inf")

    # extend(j, last[i]) is beam i's own prefix when prefix(i) = prefix(j) + last[i]: merge it into i.
    same = (beams.parent_hash[:, None, :, :] == beams.hash[:, :, None, :]).all(-1)  # [B, j, i]
    same &= (beams.length[:, None, :] == beams.length[:, :, None] + 1) & (live & has_last)[:, None, :]
    label_of_i = last[:, None, :].expand(b, k, k)
    merged = extend.gather(2, label_of_i).masked_fill(~same, float("-inf"))
    stay_pnb = torch.logaddexp(stay_pnb, merged.logsumexp(dim=1))
    taken = torch.zeros_like(extend).scatter_add_(2, label_of_i, same.to(extend.dtype)) > 0
    extend = extend.masked_fill(taken, float("-inf"))

    candidates = torch.cat([torch.logaddexp(stay_pb, stay_pnb), extend.reshape(b, k * v)], dim=1)
    if context is None:
        scores, index = candidates.topk(k, dim=1)
    else:
        boost = torch.cat([beams.context_score, (beams.context_score[..., None]
                                                 + context.gain[beams.context_state]).reshape(b, k * v)], dim=1)
        _, index = (candidates + boost).topk(k, dim=1)
        scores = candidates.gather(1, index)
    extended = index >= k
    parent = torch.where(extended, (index - k) // v, index)
    label = torch.where(extended, (index - k) % v, -1)

    parent_hash = beams.hash.gather(1, parent[..., None].expand(b, k, 2))
    new_hash = (parent_hash * const.hash_bases + label[..., None] + 1) % const.hash_moduli
    ext = extended[..., None]
    new = PrefixBeams(
        pb=torch.where(extended, float("-inf"), stay_pb.gather(1, parent)),
        pnb=torch.where(extended, scores, stay_pnb.gather(1, parent)),
        last=torch.where(extended, label, beams.last.gather(1, parent)),
        length=beams.length.gather(1, parent) + extended.long(),
        hash=torch.where(ext, new_hash, parent_hash),
        parent_hash=torch.where(ext, parent_hash, beams.parent_hash.gather(1, parent[..., None].expand(b, k, 2))),
        context_state=beams.context_state.gather(1, parent),
        context_score=beams.context_score.gather(1, parent),
    )
    if context is not None:
        new.context_state, new.context_score = context.advance(new.context_state, new.context_score, label, extended)
    return new, parent, label


def keep_finished(done: torch.Tensor, old: PrefixBeams, new: PrefixBeams) -> PrefixBeams:
    """Rows past their last frame (done: bool [B]) keep their beams."""
    kept = {}
    for field in dataclasses.fields(PrefixBeams):
        o, n = getattr(old, field.name), getattr(new, field.name)
        kept[field.name] = torch.where(done.view(-1, *[1] * (o.dim() - 1)), o, n)
    return PrefixBeams(**kept)


def run_prefix_beams(log_probs: torch.Tensor, lengths: torch.Tensor, blank_id: int, beam_size: int,
                     context: ContextGraph | None = None) -> tuple[PrefixBeams, torch.Tensor, torch.Tensor]:
    """The search over every frame: log_probs [B, T, V], lengths [B] -> (the beams it ends with, per frame the
    back-pointers [T, B, K] and the labels [T, B, K] taken, -1 for none; a row past its length stays put)."""
    b, t, v = log_probs.shape
    device = log_probs.device
    lengths = lengths.to(device)
    const = PrefixConstants.on(v, device)
    beams = PrefixBeams.empty(b, beam_size, device)
    stay_put = torch.arange(beam_size, device=device).expand(b, beam_size)
    parents = torch.empty(t, b, beam_size, dtype=torch.long, device=device)
    labels = torch.empty_like(parents)
    for frame_index in range(t):
        new, parent, label = prefix_step(beams, log_probs[:, frame_index].float(), blank_id, const, context)
        done = frame_index >= lengths
        beams = keep_finished(done, beams, new)
        parents[frame_index] = torch.where(done[:, None], stay_put, parent)
        labels[frame_index] = torch.where(done[:, None], -1, label)
    return beams, parents, labels


def prefix_beam_search(
    log_probs: torch.Tensor, lengths: torch.Tensor, blank_id: int, beam_size: int,
    context: ContextGraph | None = None,
) -> tuple[list[list[int]], torch.Tensor]:
    """log_probs: [B, T, V]; lengths: [B] -> (best label sequence per row, its score [B]).

    The score sums the alignments the beams kept: the sequence's CTC log-likelihood when nothing was pruned,
    a lower bound of it otherwise. With ``context`` (hotwords) the best is the one whose score plus the boost of
    its completed phrases is highest; the score returned is still the acoustic one.
    """
    beams, parents, labels = run_prefix_beams(log_probs, lengths, blank_id, beam_size, context)
    rank = beams.total
    if context is not None:  # an unfinished phrase gives its boost back
        rank = rank + context.kept(beams.context_state, beams.context_score)
    beam = rank.argmax(dim=1)
    scores = beams.total.gather(1, beam[:, None]).squeeze(1)
    (path,) = follow_back_pointers(parents, beam, labels)
    path = path.T.cpu()  # the one host sync
    return [row[row >= 0].tolist() for row in path], scores


@DECODE_STRATEGIES.register("ctc_prefix_beam")
class CTCPrefixBeam(LaunchesEagerly, DecodeStrategy):
    runner: ClassVar[str] = "frame_sync"  # the runner kind that drives it
    searches: ClassVar[bool] = True  # serves DecodeOptions.beam_size
    # and its lm, lexicon, lm_weight, word_bonus, beam_size_token, beam_threshold (oasr.decode.ctc_lexicon_beam)
    fuses_lm: ClassVar[bool] = True
    biases: ClassVar[bool] = True  # and its hotwords

    def __init__(self, options: CTCPrefixBeamOptions | None = None, contexts: ContextGraphCache | None = None) -> None:
        self.options = options or CTCPrefixBeamOptions()
        if self.options.hotwords and contexts is None:
            raise ValueError("hotwords need the runner's ContextGraphCache (contexts)")
        self.contexts = contexts

    @classmethod
    def for_beam(cls, beam_size: int, hotwords: tuple[Hotword, ...] = (),
                 contexts: ContextGraphCache | None = None) -> CTCPrefixBeam:
        return cls(CTCPrefixBeamOptions(beam_size=beam_size, hotwords=hotwords), contexts)

    @staticmethod
    def with_words(resources: WordResources, beam_size: int, lm_weight: float | None, word_bonus: float | None,
                   beam_size_token: int | None = None, beam_threshold: float | None = None,
                   hotwords: tuple[Hotword, ...] = ()) -> CTCLexiconBeam:
        """The lexicon search for requests that name a language model or lexicon (``resources``: loaded), with
        ``hotwords`` boosting whole words; None takes each option's default."""
        threshold = DEFAULT_BEAM_THRESHOLD if beam_threshold is None else beam_threshold
        options = LexiconBeamOptions(beam_size=beam_size,
                                     lm_weight=DEFAULT_LM_WEIGHT if lm_weight is None else lm_weight,
                                     word_bonus=0.0 if word_bonus is None else word_bonus,
                                     beam_size_token=DEFAULT_BEAM_SIZE_TOKEN if beam_size_token is None
                                     else beam_size_token, beam_threshold=threshold)
        return CTCLexiconBeam(resources, options, hotwords)

    def decode(self, model: CTCModel, encoder_output: EncoderOutput) -> list[list[int]]:
        """encoder_output: hidden [B, T, D], lengths [B] -> the most probable label sequence per row."""
        log_probs = model.ctc_log_probs(encoder_output.hidden)
        context = None
        if self.options.hotwords:
            context = self.contexts.get(self.options.hotwords, log_probs.shape[-1], log_probs.device)
        elif self.options.beam_size == 1:
            return greedy_ids(log_probs, encoder_output.lengths, model.blank_id)
        ids, _ = prefix_beam_search(log_probs, encoder_output.lengths, model.blank_id, self.options.beam_size,
                                    context)
        return ids
