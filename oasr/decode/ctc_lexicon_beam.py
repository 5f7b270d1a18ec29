"""CTC beam search over a lexicon with an n-gram language model, batched over rows on the log-probs' device.

The search is flashlight's ``LexiconDecoder`` for CTC (what torchaudio's ``ctc_decoder`` runs), with log-add
merging: a hypothesis is (word history, lexicon-trie node, last token, whether the last frame was blank) with a
score. Per frame each hypothesis may

1. take a token that leads to a child of its trie node (not its own last token unless a blank came between):
   into the child while the spelling goes on, and, for every word whose spelling ends there, back to the root
   with the word scored: ``lm_weight * log10 P_lm(word | history) + word_bonus``;
2. stay on its node: repeat its last token (a hypothesis at the root, between words, takes the blank instead);
3. take a blank.

flashlight's two pruning knobs mean what they mean there: only the frame's ``beam_size_token`` likeliest tokens
are tried for the lexicon moves (1) (the stay and blank moves always are), and candidates scoring below the
frame's best candidate minus ``beam_threshold`` are dropped before merging. Candidates with the same state are
then merged (log-sum-exp of their scores, the back-pointer of the best) and each row keeps its ``beam_size`` best.
At the end, hypotheses between words (all, when none is) add the language model's end-of-sentence score, the same
threshold drops the weak ones, and the best is traced back through per-frame back-pointers.

Scores live on the device in float64, as flashlight keeps them in doubles. Every candidate of a frame has a fixed
slot in per-row tensors ([B, M], -inf where a move does not exist). The language model's side is a
``WordHistories``: without a model or with an ARPA file it scores on the device and a frame never waits for the
host. A binary KenLM file is asked on the host, once a frame, for the distinct (history, word) pairs of the word
candidates that can still matter. Which can is decided before asking, from an upper bound: a word's log10
probability is at most 0, so with ``lm_weight >= 0`` a word candidate scores at most its score before the LM plus
``word_bonus``. A candidate whose bound falls below the threshold of the frame's best move without a word, or whose
state's bound falls below the ``beam_size``-th best state without a word (taken from candidates sure to pass the
threshold), can be neither kept nor merged into a kept state, so it is dropped unasked: the result is the same,
with far fewer LM queries.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from oasr.decode.base import EncoderOutput
from oasr.decode.ctc_greedy import CTCModel
from oasr.decode.arpa import ArpaError, ArpaTables, is_arpa
from oasr.decode.back_pointers import follow_back_pointers
from oasr.decode.ctc_lexicon_graphs import LexiconFrameGraphs
from oasr.decode.lexicon import DecodingResourceError, Lexicon, LexiconTrie, NGramLM, Spelling, arpa_unigrams
from oasr.decode.pending import LaunchesEagerly
from oasr.decode.word_boosts import WordBoosts
from oasr.decode.word_histories import DeviceHistories, HostHistories, WordHistories
from oasr.types import Hotword, check_pruning

_NEG_INF = float("-inf")
# The bound-based pruning compares sums computed in different orders: keep what lies within this of the bar.
_ROUNDING_SLACK = 1e-6
# NeMo's defaults for flashlight's decoder over its CTC models (its FlashlightConfig): the 16 likeliest tokens a
# frame, and a threshold in the emissions' natural-log units. torchaudio's ctc_decoder defaults to every token and
# 50; either pair can be asked for.
DEFAULT_BEAM_SIZE_TOKEN = 16
DEFAULT_BEAM_THRESHOLD = 20.0


@dataclass(frozen=True)
class LexiconBeamOptions:
    beam_size: int = 8
    lm_weight: float = 0.0  # weight of the language model's log10 probabilities
    word_bonus: float = 0.0  # added per emitted word
    # Per frame, only this many likeliest tokens start lexicon moves (flashlight's beamSizeToken); None: all.
    beam_size_token: int | None = DEFAULT_BEAM_SIZE_TOKEN
    # Candidates below the frame's best minus this are dropped before merging (flashlight's beamThreshold);
    # math.inf keeps every candidate (the beam alone prunes).
    beam_threshold: float = DEFAULT_BEAM_THRESHOLD

    def __post_init__(self) -> None:
        check_pruning(self.beam_size_token, self.beam_threshold)
        if self.beam_size < 1:
            raise ValueError(f"beam_size must be at least 1, got {self.beam_size}")


@dataclass
class _Hyps:
    """Per row and beam [B, K]: score (-inf: empty slot; hotword boosts included), word history key, trie node, last
    token, blank last, hotword automaton state (0 without hotwords); and the language model's context [B, K, C]."""

    score: torch.Tensor
    history: torch.Tensor
    node: torch.Tensor
    token: torch.Tensor
    blank_last: torch.Tensor
    context: torch.Tensor
    boost_state: torch.Tensor

    @classmethod
    def start(cls, batch: int, beam: int, blank_id: int, histories: WordHistories, device: torch.device) -> _Hyps:
        score = torch.full((batch, beam), _NEG_INF, dtype=torch.float64, device=device)
        score[:, 0] = 0.0
        zeros = torch.zeros(batch, beam, dtype=torch.long, device=device)
        history, context = histories.start(batch, beam, device)
        # flashlight starts on the silence token, here the blank (the only separator CTC models have).
        return cls(score, history, zeros, torch.full_like(zeros, blank_id), torch.zeros_like(zeros, dtype=torch.bool),
                   context, torch.zeros_like(zeros))


@dataclass(frozen=True)
class _Layout:
    """Where each candidate of a frame sits in its row. Without a word (Mn = K*N + 2K slots): K*N lexicon moves
    (parent beam major, then the frame's token-beam position), K stays, K blanks. With a word (Mw = K*N*L): parent,
    token-beam position, then the L labels of the node reached. ``*_parent``: the parent beam of each slot."""

    num_tokens: int  # N: the token beam
    num_labels: int  # L
    positions: torch.Tensor  # [N]: 0 .. N-1
    plain_parent: torch.Tensor  # [Mn]
    word_parent: torch.Tensor  # [Mw]
    word_position: torch.Tensor  # [Mw]: the slot's token-beam position

    @classmethod
    def of(cls, beam: int, num_tokens: int, num_labels: int, device: torch.device) -> _Layout:
        beams = torch.arange(beam, device=device)
        positions = torch.arange(num_tokens, device=device)
        plain = torch.cat([beams.repeat_interleave(num_tokens), beams, beams])
        word_parent = beams.repeat_interleave(num_tokens * num_labels)
        return cls(num_tokens, num_labels, positions, plain, word_parent,
                   positions.repeat_interleave(num_labels).repeat(beam))


def _merge(score: torch.Tensor, group: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """score, group: [B, M] (group ids in [0, M)) -> per group id [B, M]: the log-sum-exp of its scores (-inf: no
    live slot) and its winner, the first slot holding its best score (M where none is live)."""
    m = score.shape[1]
    merged, best_of_slot = _log_sum_exp(score, group)
    slots = torch.arange(m, device=score.device).expand_as(group)
    candidate = torch.where((score > _NEG_INF) & (score == best_of_slot), slots, m)
    winner = torch.full_like(group, m).scatter_reduce(1, group, candidate, "amin")
    return merged, winner


def _log_sum_exp(score: torch.Tensor, group: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (per group id, the log-sum-exp of its scores; per slot, its group's best score), each [B, M]."""
    best = _group_max(score, group)
    best_of_slot = best.gather(1, group)
    live = score > _NEG_INF
    total = torch.zeros_like(score).scatter_add(1, group, torch.where(live, (score - best_of_slot).exp(), 0.0))
    # Most group ids are empty: the log of their zero total is slow on the host and not needed.
    return torch.where(total > 0, best + torch.where(total > 0, total, 1.0).log(), _NEG_INF), best_of_slot


def _group_max(score: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    return torch.full_like(score, _NEG_INF).scatter_reduce(1, group, score, "amax")


def _kth_best(score: torch.Tensor, k: int) -> torch.Tensor:
    """score: [B, M] -> [B, 1]: the k-th largest of each row."""
    return score.topk(k, dim=1).values[:, -1:]


@dataclass
class _Frame:
    """One frame's candidates. Without a word: score, node, token, state group [B, Mn]. With a word: score before
    the language model, word, history of the parent, state group [B, Mw]. Candidates of one state share a group
    id (a slot of theirs); the two kinds never reach the same state."""

    tokens: torch.Tensor  # [B, N]: the token beam
    plain_score: torch.Tensor
    plain_node: torch.Tensor
    plain_token: torch.Tensor
    plain_group: torch.Tensor
    word_score: torch.Tensor
    word: torch.Tensor
    word_history: torch.Tensor
    word_context: torch.Tensor  # [B, Mw, C]
    word_group: torch.Tensor
    # [B, Mw]: log of how many beams share the parent's place. A word state's candidates come from those beams,
    # one each, so its log-sum-exp is at most its best candidate plus this.
    word_spread: torch.Tensor


@dataclass(frozen=True)
class _Weights:
    """The options that are numbers in a frame's arithmetic, as float64 scalars on the search's device: a frame
    captured as a graph reads them from here, so one graph serves every value (``LexiconFrameGraphs`` copies a
    search's weights in before its frames replay)."""

    lm_weight: torch.Tensor
    word_bonus: torch.Tensor
    beam_threshold: torch.Tensor

    @classmethod
    def of(cls, options: LexiconBeamOptions, device: torch.device) -> _Weights:
        def scalar(value: float) -> torch.Tensor:
            return torch.tensor(value, dtype=torch.float64, device=device)

        return cls(scalar(options.lm_weight), scalar(options.word_bonus), scalar(options.beam_threshold))


class LexiconBeamSearch:
    """One batched search. ``trie`` and the log-probs share a device; ``histories`` is this search's own."""

    def __init__(self, trie: LexiconTrie, histories: WordHistories, blank_id: int,
                 options: LexiconBeamOptions, boosts: WordBoosts | None = None) -> None:
        self.trie = trie
        self.histories = histories
        self.blank_id = blank_id
        self.options = options
        self.boosts = boosts  # hotwords, as boosts of whole words
        self.weights = _Weights.of(options, trie.child.device)
        # Candidates that cannot matter are left unasked where asking costs a sync. A word's score after the LM is
        # bounded by its score before plus word_bonus only while the LM can only lower it; with a negative weight
        # every word candidate is asked.
        self._bounded = histories.syncs and options.lm_weight >= 0

    def run(self, log_probs: torch.Tensor, lengths: torch.Tensor,
            graphs: LexiconFrameGraphs | None = None) -> tuple[list[list[int]], list[list[int]], list[float]]:
        """log_probs: [B, T, V]; lengths: [B] -> per row (emitted token ids, word ids, score) of the best. With
        ``graphs`` and a language model that never makes a frame wait for the host, the frames run as captured
        graphs (on CUDA)."""
        # A captured frame holds its tensors: a hotword list's tables would need a graph of their own.
        if graphs is not None and not self.histories.syncs and self.boosts is None:
            return self._finish(*graphs.run(self, log_probs, lengths))
        b, t, v = log_probs.shape
        k = self.options.beam_size
        device = log_probs.device
        layout = self.layout(v, device)
        lengths = lengths.to(device)
        hyps = self.start(b, device)
        parents = torch.zeros(t, b, k, dtype=torch.long, device=device)
        emitted = torch.full((t, b, k), -1, dtype=torch.long, device=device)
        words = torch.full_like(emitted, -1)
        for frame_index in range(t):
            hyps, parents[frame_index], emitted[frame_index], words[frame_index] = self.advance(
                hyps, log_probs[:, frame_index].double(), layout, frame_index < lengths)
        return self._finish(hyps, parents, emitted, words)

    @property
    def graph_key(self) -> tuple[int, int | None]:
        """The options that shape a frame's tensors (the rest are ``weights``): what a captured frame depends on."""
        return self.options.beam_size, self.options.beam_size_token

    def layout(self, vocab_size: int, device: torch.device) -> _Layout:
        num_tokens = vocab_size if self.options.beam_size_token is None else min(self.options.beam_size_token,
                                                                                  vocab_size)
        return _Layout.of(self.options.beam_size, num_tokens, self.trie.labels.shape[1], device)

    def start(self, batch: int, device: torch.device) -> _Hyps:
        return _Hyps.start(batch, self.options.beam_size, self.blank_id, self.histories, device)

    def advance(self, hyps: _Hyps, frame: torch.Tensor, layout: _Layout,
                active: torch.Tensor) -> tuple[_Hyps, torch.Tensor, torch.Tensor, torch.Tensor]:
        """One frame: frame [B, V] float64, active [B] (rows past their length keep their hypotheses) -> (the
        hypotheses after it, then per [B, K]: parent beam, emitted token, emitted word; -1: none)."""
        b, k = hyps.score.shape
        new, parent, token, word = self._step(hyps, frame, layout, active)
        done = ~active[:, None]
        kept = _Hyps(*(torch.where(done.view(b, 1, *([1] * (getattr(new, f).dim() - 2))), getattr(hyps, f),
                                   getattr(new, f)) for f in _Hyps.__dataclass_fields__))
        keep = torch.arange(k, device=frame.device).expand(b, k)
        return kept, torch.where(done, keep, parent), torch.where(done, -1, token), torch.where(done, -1, word)

    def _step(self, hyps: _Hyps, frame: torch.Tensor, layout: _Layout,
              active: torch.Tensor) -> tuple[_Hyps, torch.Tensor, torch.Tensor, torch.Tensor]:
        """frame: [B, V] float64; active: [B] -> (the next hypotheses, then per [B, K]: parent beam, emitted
        token, emitted word; -1: none)."""
        options, weights = self.options, self.weights
        threshold = weights.beam_threshold
        cands = self._candidates(hyps, frame, layout)
        boost_state, gain = self._boosted(hyps, cands, layout)
        best_plain = cands.plain_score.max(1, keepdim=True).values
        asked = (cands.word_score > _NEG_INF) & active[:, None]
        if self._bounded:
            bound = cands.word_score + weights.word_bonus + gain
            asked &= bound >= best_plain - threshold
            bound = torch.where(asked, bound, _NEG_INF)
            # The frame's best lies between best_plain and best_bound: a candidate without a word at or above
            # best_bound - threshold passes the threshold whatever the LM says, so the states those make are a
            # floor under the beam_size-th best state.
            best_bound = torch.maximum(best_plain, bound.max(1, keepdim=True).values)
            sure = torch.where(cands.plain_score >= best_bound - threshold, cands.plain_score, _NEG_INF)
            floor = _kth_best(_group_max(sure, cands.plain_group), options.beam_size)
            state_bound = _group_max(bound, cands.word_group).gather(1, cands.word_group) + cands.word_spread
            asked &= state_bound >= floor - _ROUNDING_SLACK
        history, context, lm = self.histories.extend(cands.word_history, cands.word_context, cands.word, asked,
                                                     cands.word_group)
        word_score = torch.where(asked, cands.word_score + weights.lm_weight * lm + weights.word_bonus + gain,
                                 _NEG_INF)
        best = torch.maximum(best_plain, word_score.max(1, keepdim=True).values)
        plain = torch.where(cands.plain_score >= best - threshold, cands.plain_score, _NEG_INF)
        word_score = torch.where(word_score >= best - threshold, word_score, _NEG_INF)
        # One merge over both kinds: word groups follow the plain ones (no state is reached by both).
        num_plain = plain.shape[1]
        merged = _merge(torch.cat([plain, word_score], 1),
                        torch.cat([cands.plain_group, cands.word_group + num_plain], 1))
        return self._select(hyps, cands, history, context, boost_state, merged, layout)

    def _boosted(self, hyps: _Hyps, cands: _Frame,
                 layout: _Layout) -> tuple[torch.Tensor | None, torch.Tensor | float]:
        """Each word candidate's hotword automaton state after its word and the boost the word adds, [B, Mw];
        without hotwords (None, 0.0): every state stays 0."""
        if self.boosts is None:
            return None, 0.0
        parent_state = hyps.boost_state[:, layout.word_parent]
        symbol = self.boosts.symbol[cands.word.clamp(min=0)]
        graph = self.boosts.graph
        return graph.next_state[parent_state, symbol], graph.gain[parent_state, symbol].double()

    def _candidates(self, hyps: _Hyps, frame: torch.Tensor, layout: _Layout) -> _Frame:
        b, k = hyps.score.shape
        v = frame.shape[1]
        n = layout.num_tokens
        if n < v:
            token_scores, tokens = frame.topk(n, dim=1)
            position = torch.full((b, v), -1, dtype=torch.long, device=frame.device)
            position.scatter_(1, tokens, layout.positions.expand(b, n))
            token_position = position.gather(1, hyps.token)  # [B, K], -1: outside the token beam
        else:
            token_scores, tokens = frame, layout.positions.expand(b, v)
            token_position = hyps.token
        live = hyps.score > _NEG_INF
        beam_tokens = tokens[:, None, :]  # [B, 1, N]
        child = self.trie.child[hyps.node[:, :, None], beam_tokens]  # [B, K, N]
        reached = child.clamp(min=0)
        extended = hyps.score[..., None] + token_scores[:, None, :]
        moves = live[..., None] & (child >= 0)
        new_token = hyps.blank_last[..., None] | (beam_tokens != hyps.token[..., None])
        inside = moves & self.trie.has_children[reached] & new_token
        at_root = hyps.node == 0
        stay_token = torch.where(at_root, self.blank_id, hyps.token)
        stay = live & (~hyps.blank_last | at_root)
        plain_score = torch.cat([torch.where(inside, extended, _NEG_INF).view(b, k * n),
                                 torch.where(stay, hyps.score + frame.gather(1, stay_token), _NEG_INF),
                                 torch.where(live, hyps.score + frame[:, self.blank_id, None], _NEG_INF)], 1)
        plain_node = torch.cat([reached.view(b, k * n), hyps.node, hyps.node], 1)
        plain_token = torch.cat([beam_tokens.expand(b, k, n).reshape(b, k * n), stay_token,
                                 torch.full_like(stay_token, self.blank_id)], 1)
        # Words: the trie node's labels; at the root a one-token word needs a blank before it repeats.
        labels = self.trie.labels[reached]  # [B, K, N, L]
        repeat_at_root = at_root[..., None] & (beam_tokens == hyps.token[..., None])
        ends = (moves & ~repeat_at_root)[..., None] & (labels >= 0)
        word_score = torch.where(ends, extended[..., None], _NEG_INF).view(b, -1)
        place, sharing, plain_group = self._plain_groups(hyps, token_position, layout)
        # A word's state is (its history extended by the word, the root, the token): one per place, token and
        # label, as the word fixes the node its spelling ends at.
        word_group = (place[:, :, None] * n + layout.positions)[..., None] * layout.num_labels
        word_group = (word_group + torch.arange(layout.num_labels, device=frame.device)).view(b, -1)
        return _Frame(tokens, plain_score, plain_node, plain_token, plain_group, word_score, labels.view(b, -1),
                      hyps.history[:, layout.word_parent], hyps.context[:, layout.word_parent], word_group,
                      sharing.double().log()[:, layout.word_parent])

    def _plain_groups(self, hyps: _Hyps, token_position: torch.Tensor,
                      layout: _Layout) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """-> (each beam's place [B, K]: the first beam of its row with its history and node; how many beams share
        it [B, K]; each candidate without a word's state group [B, Mn]). Beams of one place reach the same states by
        the same move, so their candidates share the slots of the place's beam; a beam inside a word staying on its
        node is the state that beams of its history one node up reach by its token (its last token spelled its
        node)."""
        k, n = hyps.score.shape[1], layout.num_tokens
        same_history = hyps.history[:, :, None] == hyps.history[:, None, :]  # [B, K, K]
        same_place = same_history & (hyps.node[:, :, None] == hyps.node[:, None, :])
        place = same_place.long().argmax(2)
        up = same_history & (hyps.node[:, None, :] == self.trie.parent[hyps.node][:, :, None])
        from_up = up.any(2) & (token_position >= 0) & (hyps.node != 0)
        up_place = place.gather(1, up.long().argmax(2))
        stay = torch.where(from_up, up_place * n + token_position, k * n + place)
        inside = (place[:, :, None] * n + layout.positions).view(-1, k * n)
        return place, same_place.sum(2), torch.cat([inside, stay, k * n + k + place], 1)

    def _select(self, hyps: _Hyps, cands: _Frame, history: torch.Tensor, context: torch.Tensor,
                boost_state: torch.Tensor | None, merged: tuple[torch.Tensor, torch.Tensor],
                layout: _Layout) -> tuple[_Hyps, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The best ``beam_size`` merged states of each row ((merged score, winner slot) per group [B, Mn + Mw],
        the word candidates' slots after the plain ones) -> what ``_step`` returns."""
        k = self.options.beam_size
        num_plain, num_word = cands.plain_score.shape[1], cands.word_score.shape[1]
        score, pick = merged[0].topk(k, dim=1)
        live = score > _NEG_INF
        slot = merged[1].gather(1, pick).clamp(max=num_plain + num_word - 1)
        is_word = slot >= num_plain
        plain_slot = slot.clamp(max=num_plain - 1)
        word_slot = (slot - num_plain).clamp(min=0)
        plain_parent = layout.plain_parent[plain_slot]
        parent = torch.where(is_word, layout.word_parent[word_slot], plain_parent)
        token = torch.where(is_word, cands.tokens.gather(1, layout.word_position[word_slot]),
                            cands.plain_token.gather(1, plain_slot))
        node = torch.where(is_word | ~live, 0, cands.plain_node.gather(1, plain_slot))
        blank_last = ~is_word & (plain_slot >= num_plain - k)
        new_history = torch.where(is_word, history.gather(1, word_slot), hyps.history.gather(1, plain_parent))
        width = context.shape[-1]
        new_context = torch.where(is_word[..., None], context.gather(1, word_slot[..., None].expand(-1, -1, width)),
                                  hyps.context.gather(1, plain_parent[..., None].expand(-1, -1, width)))
        emitted = torch.where(is_word | (plain_slot < num_plain - 2 * k), token, -1)
        word = torch.where(is_word, cands.word.gather(1, word_slot), -1)
        new_boost_state = hyps.boost_state if boost_state is None else torch.where(
            is_word, boost_state.gather(1, word_slot), hyps.boost_state.gather(1, plain_parent))
        new = _Hyps(score, new_history, node, token, blank_last, new_context, new_boost_state)
        return new, torch.where(live, parent, 0), torch.where(live, emitted, -1), torch.where(live, word, -1)

    def _finish(self, hyps: _Hyps, parents: torch.Tensor, emitted: torch.Tensor,
                words: torch.Tensor) -> tuple[list[list[int]], list[list[int]], list[float]]:
        """hyps after the last frame [B, K] and the back-pointers [T, B, K] -> what ``run`` returns."""
        live = hyps.score > _NEG_INF
        between_words = live & (hyps.node == 0)
        ending = torch.where(between_words.any(1, keepdim=True), between_words, live).tolist()
        score = hyps.score if self.boosts is None else hyps.score - self.boosts.graph.pending[hyps.boost_state]
        scores, histories, nodes = score.tolist(), hyps.history.tolist(), hyps.node.tolist()
        sentence_ends = self.histories.finish(hyps.history, hyps.context).tolist()
        token_rows, word_rows, best_scores, best_beams = [], [], [], []
        for row in range(len(scores)):
            ends = {k: scores[row][k] + self.options.lm_weight * sentence_ends[row][k]
                    for k in range(len(scores[row])) if ending[row][k]}
            floor = max(ends.values()) - self.options.beam_threshold
            # Ending merges the hypotheses of one history and node (they differ only in their last token), as
            # flashlight's end-of-sentence state is one per history.
            ended: dict[tuple[int, int], tuple[float, float, int]] = {}
            for k, score in ends.items():
                if score < floor:
                    continue
                key = (histories[row][k], nodes[row][k])
                if key in ended:
                    total, best, beam = ended[key]
                    ended[key] = (_log_add(total, score), *((score, k) if score > best else (best, beam)))
                else:
                    ended[key] = (score, score, k)
            total, _, beam = max(ended.values())
            best_scores.append(total)
            best_beams.append(beam)
        best = torch.tensor(best_beams, dtype=torch.long, device=parents.device)
        path_tokens, path_words = (path.T.cpu().numpy() for path in follow_back_pointers(parents, best, emitted, words))
        for tokens, row_words in zip(path_tokens, path_words, strict=True):
            # The tokens of a word left unfinished at the end (no hypothesis was between words) are dropped:
            # only words count.
            ended_at = np.flatnonzero(row_words >= 0)
            spelled = tokens[: ended_at[-1] + 1] if len(ended_at) else tokens[:0]
            token_rows.append(spelled[spelled >= 0].tolist())
            word_rows.append(row_words[ended_at].tolist())
        return token_rows, word_rows, best_scores


def _log_add(a: float, b: float) -> float:
    high, low = max(a, b), min(a, b)
    return high + math.log1p(math.exp(low - high))


class WordResources:
    """A lexicon and the language model, if any, loaded once (an ARPA file as tables, a binary one through KenLM);
    the lexicon's trie and the tables are moved to a device the first time a search there needs them."""

    def __init__(self, lexicon: Lexicon, lm: ArpaTables | NGramLM | None, *, cuda_graphs: bool = True,
                 compile_frames: bool = False) -> None:
        self.lexicon = lexicon
        self.lm = lm
        self._tries: dict[tuple[int, str], LexiconTrie] = {}
        self._histories: dict[str, DeviceHistories] = {}
        self._boosts: dict[tuple[tuple[Hotword, ...], str], WordBoosts] = {}
        # Searches on CUDA replay their frames as graphs, which hold this resource's tries and tables.
        self.frame_graphs = LexiconFrameGraphs(compile_frames=compile_frames) if cuda_graphs else None

    def trie(self, vocab_size: int, device: torch.device) -> LexiconTrie:
        key = (vocab_size, str(device))
        if key not in self._tries:
            self._tries[key] = LexiconTrie.build(self.lexicon, vocab_size, device)
        return self._tries[key]

    def boosts(self, hotwords: tuple[Hotword, ...], device: torch.device) -> WordBoosts:
        """A hotword list's automaton over this lexicon's words, built once per list and device; ``HotwordsError``
        names a word the lexicon lacks."""
        key = (hotwords, str(device))
        if key not in self._boosts:
            self._boosts[key] = WordBoosts.build(hotwords, self.lexicon, device)
        return self._boosts[key]

    def histories(self, device: torch.device) -> WordHistories:
        """A search's own language-model side on ``device``."""
        if isinstance(self.lm, NGramLM):
            return HostHistories(self.lm, self.lexicon.words)
        if str(device) not in self._histories:  # stateless: one per device, which captured graphs may hold
            tables = self.lm.to(device) if self.lm is not None else None
            self._histories[str(device)] = DeviceHistories(tables, self.lexicon.words, device)
        return self._histories[str(device)]


def load_lm(path: str | Path) -> ArpaTables | NGramLM:
    """An ARPA file read into tables (the search scores on the device; KenLM is not needed), a binary one opened
    with KenLM."""
    path = Path(path)
    if not path.is_file():
        raise DecodingResourceError(f"language model file not found: {path}")
    if not is_arpa(path):
        return NGramLM(path)
    try:
        return ArpaTables.read(path)
    except (ArpaError, ValueError, UnicodeError) as e:
        raise DecodingResourceError(f"cannot read the language model {path}: {e}") from e


class WordResourceCache:
    """The lexicons and language models one runner has loaded, by (lm, lexicon) path: loading a large LM takes
    seconds, so every request naming the same files shares one copy."""

    def __init__(self, tokenizer: Spelling, *, cuda_graphs: bool = True, compile_frames: bool = False) -> None:
        self.tokenizer = tokenizer
        self.cuda_graphs = cuda_graphs
        self.compile_frames = compile_frames  # torch.compile the frames the graphs capture
        self._loaded: dict[tuple[str | None, str | None], WordResources] = {}

    def get(self, lm_path: str | None, lexicon_path: str | None) -> WordResources:
        key = (lm_path, lexicon_path)
        if key not in self._loaded:
            lm = load_lm(lm_path) if lm_path is not None else None
            if lexicon_path is not None:
                lexicon = Lexicon.from_file(lexicon_path, self.tokenizer)
            elif isinstance(lm, ArpaTables):
                lexicon = Lexicon.spelled(arpa_unigrams(lm_path), self.tokenizer)
            else:
                raise DecodingResourceError(f"{lm_path} is a binary language model: give a lexicon (one word a line)")
            if not lexicon.words:
                raise DecodingResourceError("the lexicon holds no word the model's tokenizer can spell")
            self._loaded[key] = WordResources(lexicon, lm, cuda_graphs=self.cuda_graphs,
                                               compile_frames=self.compile_frames)
        return self._loaded[key]


class CTCLexiconBeam(LaunchesEagerly):
    """The word-level search as a frame-synchronous strategy for one group of requests with the same options
    (``CTCPrefixBeam.with_words`` builds it)."""

    def __init__(self, resources: WordResources, options: LexiconBeamOptions,
                 hotwords: tuple[Hotword, ...] = ()) -> None:
        self.resources = resources
        self.options = options
        self.hotwords = hotwords

    def decode(self, model: CTCModel, encoder_output: EncoderOutput) -> list[list[int]]:
        """encoder_output: hidden [B, T, D], lengths [B] -> the best hypothesis' tokens per row."""
        log_probs = model.ctc_log_probs(encoder_output.hidden)
        trie = self.resources.trie(log_probs.shape[-1], log_probs.device)
        boosts = self.resources.boosts(self.hotwords, log_probs.device) if self.hotwords else None
        search = LexiconBeamSearch(trie, self.resources.histories(log_probs.device), model.blank_id, self.options,
                                   boosts)
        graphs = self.resources.frame_graphs if log_probs.is_cuda else None
        tokens, _, _ = search.run(log_probs, encoder_output.lengths, graphs)
        return tokens
