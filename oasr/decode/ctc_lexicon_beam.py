"""CTC beam search over a lexicon with an n-gram language model, batched over rows on the log-probs' device.

The search is flashlight's ``LexiconDecoder`` for CTC (what torchaudio's ``ctc_decoder`` runs), with log-add
merging and no pruning but the beam: a hypothesis is (word history, lexicon-trie node, last token, whether the
last frame was blank) with a score. Per frame each hypothesis may

1. take a token that leads to a child of its trie node (not its own last token unless a blank came between):
   into the child while the spelling goes on, and, for every word whose spelling ends there, back to the root
   with the word scored: ``lm_weight * log10 P_lm(word | history) + word_bonus``;
2. stay on its node: repeat its last token (a hypothesis at the root, between words, takes the blank instead);
3. take a blank.

Candidates with the same state are merged (log-sum-exp of their scores, the back-pointer of the best) and each row
keeps its ``beam_size`` best. At the end, hypotheses between words (all, when none is) add the language model's
end-of-sentence score, and the best is traced back through per-frame back-pointers.

Scores live on the device in float64, as flashlight keeps them in doubles. The language model is queried on the
host, once per frame for the whole batch, for the (history, word) pairs that candidates complete; each pair is
asked once per search.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from oasr.decode.base import EncoderOutput
from oasr.decode.ctc_greedy import CTCModel
from oasr.decode.lexicon import (DecodingResourceError, Lexicon, LexiconTrie, LMHistories, NGramLM, Spelling,
                                 arpa_unigrams)
from oasr.decode.pending import LaunchesEagerly

_NEG_INF = float("-inf")


@dataclass(frozen=True)
class LexiconBeamOptions:
    beam_size: int = 8
    lm_weight: float = 0.0  # weight of the language model's log10 probabilities
    word_bonus: float = 0.0  # added per emitted word

    def __post_init__(self) -> None:
        if self.beam_size < 1:
            raise ValueError(f"beam_size must be at least 1, got {self.beam_size}")


@dataclass
class _Hyps:
    """Per row and beam [B, K]: score (-inf: empty slot), word history id, trie node, last token, blank last."""

    score: torch.Tensor
    history: torch.Tensor
    node: torch.Tensor
    token: torch.Tensor
    blank_last: torch.Tensor

    @classmethod
    def start(cls, batch: int, beam: int, blank_id: int, device: torch.device) -> _Hyps:
        score = torch.full((batch, beam), _NEG_INF, dtype=torch.float64, device=device)
        score[:, 0] = 0.0
        zeros = torch.zeros(batch, beam, dtype=torch.long, device=device)
        # flashlight starts on the silence token, here the blank (the only separator CTC models have).
        return cls(score, zeros, zeros.clone(), torch.full_like(zeros, blank_id),
                   torch.zeros_like(zeros, dtype=torch.bool))


@dataclass
class _Candidates:
    """Flat [M] candidate hypotheses of one frame: their row, parent beam, score, state, emitted token and word
    (-1: none)."""

    row: torch.Tensor
    parent: torch.Tensor
    score: torch.Tensor
    history: torch.Tensor
    node: torch.Tensor
    token: torch.Tensor
    blank_last: torch.Tensor
    emitted: torch.Tensor
    word: torch.Tensor

    @staticmethod
    def concat(parts: list[_Candidates]) -> _Candidates:
        return _Candidates(*(torch.cat([getattr(p, f) for p in parts]) for f in _Candidates.__dataclass_fields__))


def _select(mask: torch.Tensor, **fields: torch.Tensor) -> _Candidates:
    """The candidates where ``mask`` ([B, K, ...]) holds; every field broadcasts to its shape."""
    index = mask.nonzero(as_tuple=True)
    row, parent = index[0], index[1]
    picked = {name: value.expand(mask.shape)[index] for name, value in fields.items()}
    return _Candidates(row=row, parent=parent, **picked)


class LexiconBeamSearch:
    """One batched search. ``trie`` and the log-probs share a device; ``histories`` is this search's own."""

    def __init__(self, trie: LexiconTrie, histories: LMHistories, blank_id: int, options: LexiconBeamOptions) -> None:
        self.trie = trie
        self.histories = histories
        self.blank_id = blank_id
        self.options = options

    def _expand(self, hyps: _Hyps, frame: torch.Tensor) -> _Candidates:
        """frame: [B, V] float64 log-probs -> every candidate of this frame (unmerged)."""
        b, k = hyps.score.shape
        v = frame.shape[1]
        live = hyps.score > _NEG_INF
        tokens = torch.arange(v, device=frame.device).view(1, 1, v)
        child = self.trie.child[hyps.node]  # [B, K, V]
        reached = child.clamp(min=0)
        extended = hyps.score[..., None] + frame[:, None, :]  # [B, K, V]
        new_token = hyps.blank_last[..., None] | (tokens != hyps.token[..., None])
        # (1a) into a child that spells on
        inside = live[..., None] & (child >= 0) & self.trie.has_children[reached] & new_token
        parts = [_select(inside, score=extended, history=hyps.history[..., None], node=child,
                         token=tokens, blank_last=torch.zeros((), dtype=torch.bool, device=frame.device),
                         emitted=tokens, word=torch.full((), -1, dtype=torch.long, device=frame.device))]
        # (1b) a word that ends at the child; at the root, a one-token word needs a blank before it repeats
        labels = self.trie.labels[reached]  # [B, K, V, L]
        repeat_at_root = (hyps.node == 0)[..., None] & (tokens == hyps.token[..., None])
        ends = (live[..., None] & (child >= 0) & ~repeat_at_root)[..., None] & (labels >= 0)
        parts.append(self._words(ends, hyps, extended, labels))
        # (2) stay on the node; (3) blank
        at_root = hyps.node == 0
        stay_token = torch.where(at_root, self.blank_id, hyps.token)
        stay_score = hyps.score + frame.gather(1, stay_token)
        blank_score = hyps.score + frame[:, self.blank_id, None]
        none = torch.full((), -1, dtype=torch.long, device=frame.device)
        parts.append(_select(live & (~hyps.blank_last | at_root), score=stay_score, history=hyps.history,
                             node=hyps.node, token=stay_token, blank_last=torch.zeros_like(live),
                             emitted=none, word=none))
        parts.append(_select(live, score=blank_score, history=hyps.history, node=hyps.node,
                             token=torch.full_like(hyps.token, self.blank_id), blank_last=torch.ones_like(live),
                             emitted=none, word=none))
        return _Candidates.concat(parts)

    def _words(self, ends: torch.Tensor, hyps: _Hyps, extended: torch.Tensor, labels: torch.Tensor) -> _Candidates:
        """Candidates that complete a word ([B, K, V, L] mask), scored by the language model on the host."""
        v = extended.shape[-1]
        tokens = torch.arange(v, device=extended.device).view(1, 1, v, 1)
        found = _select(ends, score=extended[..., None], history=hyps.history[..., None, None], node=labels,
                        token=tokens, blank_last=torch.zeros((), dtype=torch.bool, device=extended.device),
                        emitted=tokens, word=labels)
        pairs = torch.stack([found.history, found.word], 1).tolist()  # the frame's one host sync
        ids, lm_scores = self.histories.advance([tuple(p) for p in pairs])
        found.history = torch.tensor(ids, dtype=torch.long).to(extended.device)
        lm = torch.tensor(lm_scores, dtype=torch.float64).to(extended.device)
        found.score = found.score + self.options.lm_weight * lm + self.options.word_bonus
        found.node = torch.zeros_like(found.node)
        return found

    def _merge_and_prune(self, cands: _Candidates,
                         batch: int) -> tuple[_Hyps, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Merges candidates of equal state and keeps each row's best ``beam_size`` -> (hypotheses, then per
        [B, K]: parent beam, emitted token, emitted word)."""
        k = self.options.beam_size
        device = cands.score.device
        state = torch.stack([cands.row, cands.history, cands.node, cands.token, cands.blank_last.long()], 1)
        unique, group = self._group(state)  # sorted: rows are contiguous
        g = unique.shape[0]
        best = torch.full((g,), _NEG_INF, dtype=torch.float64, device=device)
        best = best.scatter_reduce(0, group, cands.score, "amax")
        total = torch.zeros(g, dtype=torch.float64, device=device)
        total = total.scatter_add(0, group, (cands.score - best[group]).exp())
        merged = best + total.log()
        # The merged state keeps the back-pointer of its best candidate (the first of equals).
        order = torch.arange(cands.score.shape[0], device=device)
        winner = torch.full((g,), cands.score.shape[0], device=device)
        winner = winner.scatter_reduce(0, group, torch.where(cands.score == best[group], order, winner[group]), "amin")

        rows = unique[:, 0]
        counts = torch.bincount(rows, minlength=batch)
        starts = counts.cumsum(0) - counts
        width = max(int(counts.max()), k)
        table = torch.full((batch, width), _NEG_INF, dtype=torch.float64, device=device)
        table[rows, torch.arange(g, device=device) - starts[rows]] = merged
        score, slot = table.topk(k, dim=1)
        pick = (starts[:, None] + slot).clamp(max=g - 1)
        w = winner[pick]
        live = score > _NEG_INF
        w = torch.where(live, w, 0)
        hyps = _Hyps(score, unique[pick, 1], unique[pick, 2], unique[pick, 3], unique[pick, 4].bool())
        parent = torch.where(live, cands.parent[w], 0)
        return hyps, parent, torch.where(live, cands.emitted[w], -1), torch.where(live, cands.word[w], -1)

    def _group(self, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """state: [M, 5] (row, history, node, token, blank) -> (the distinct states [G, 5] in row-major order,
        each candidate's group [M]). The columns are packed into one int64 key where they fit (a sort of keys is
        several times faster than torch.unique over rows); the row-wise unique is the fallback."""
        num_nodes, vocab = self.trie.child.shape
        sizes = (self.histories.num_states, num_nodes, vocab, 2)
        if int(state[:, 0].max()) + 1 > (1 << 62) // (sizes[0] * sizes[1] * sizes[2] * sizes[3]):
            return torch.unique(state, dim=0, return_inverse=True)
        key = state[:, 0]
        for column, size in enumerate(sizes, start=1):
            key = key * size + state[:, column]
        keys, group = torch.unique(key, return_inverse=True)
        first = torch.full_like(keys, state.shape[0]).scatter_reduce(
            0, group, torch.arange(state.shape[0], device=state.device), "amin")
        return state[first], group

    def run(self, log_probs: torch.Tensor,
            lengths: torch.Tensor) -> tuple[list[list[int]], list[list[int]], list[float]]:
        """log_probs: [B, T, V]; lengths: [B] -> per row (emitted token ids, word ids, score) of the best."""
        b, t, _ = log_probs.shape
        k = self.options.beam_size
        device = log_probs.device
        lengths = lengths.to(device)
        hyps = _Hyps.start(b, k, self.blank_id, device)
        keep = torch.arange(k, device=device).expand(b, k)
        parents = torch.zeros(t, b, k, dtype=torch.long, device=device)
        emitted = torch.full((t, b, k), -1, dtype=torch.long, device=device)
        words = torch.full_like(emitted, -1)
        for frame_index in range(t):
            cands = self._expand(hyps, log_probs[:, frame_index].double())
            new, parent, token, word = self._merge_and_prune(cands, b)
            done = (frame_index >= lengths)[:, None]
            hyps = _Hyps(*(torch.where(done, getattr(hyps, f), getattr(new, f)) for f in _Hyps.__dataclass_fields__))
            parents[frame_index] = torch.where(done, keep, parent)
            emitted[frame_index] = torch.where(done, -1, token)
            words[frame_index] = torch.where(done, -1, word)
        return self._finish(hyps, parents, emitted, words)

    def _finish(self, hyps: _Hyps, parents: torch.Tensor, emitted: torch.Tensor,
                words: torch.Tensor) -> tuple[list[list[int]], list[list[int]], list[float]]:
        live = hyps.score > _NEG_INF
        between_words = live & (hyps.node == 0)
        ending = torch.where(between_words.any(1, keepdim=True), between_words, live).tolist()
        scores, histories, nodes = hyps.score.tolist(), hyps.history.tolist(), hyps.node.tolist()
        parents, emitted, words = parents.cpu(), emitted.cpu(), words.cpu()
        token_rows, word_rows, best_scores = [], [], []
        for row in range(len(scores)):
            # Ending merges the hypotheses of one history and node (they differ only in their last token), as
            # flashlight's end-of-sentence state is one per history.
            ended: dict[tuple[int, int], tuple[float, float, int]] = {}
            for k in range(len(scores[row])):
                if not ending[row][k]:
                    continue
                score = scores[row][k] + self.options.lm_weight * self.histories.finish(histories[row][k])
                key = (histories[row][k], nodes[row][k])
                if key in ended:
                    total, best, beam = ended[key]
                    ended[key] = (float(torch.logaddexp(torch.tensor(total, dtype=torch.float64),
                                                        torch.tensor(score, dtype=torch.float64))),
                                  *((score, k) if score > best else (best, beam)))
                else:
                    ended[key] = (score, score, k)
            total, _, beam = max(ended.values())
            tokens, row_words = self._trace(parents[:, row], emitted[:, row], words[:, row], beam)
            token_rows.append(tokens)
            word_rows.append(row_words)
            best_scores.append(total)
        return token_rows, word_rows, best_scores

    @staticmethod
    def _trace(parents: torch.Tensor, emitted: torch.Tensor, words: torch.Tensor,
               beam: int) -> tuple[list[int], list[int]]:
        """One row's back-pointers [T, K] from ``beam`` at the last frame -> (emitted tokens, words). The tokens
        of a word left unfinished at the end (no hypothesis was between words) are dropped: only words count."""
        tokens, row_words = [], []
        for frame_index in reversed(range(parents.shape[0])):
            if words[frame_index, beam] >= 0:
                row_words.append(int(words[frame_index, beam]))
            if emitted[frame_index, beam] >= 0 and row_words:
                tokens.append(int(emitted[frame_index, beam]))
            beam = int(parents[frame_index, beam])
        return tokens[::-1], row_words[::-1]


class WordResources:
    """A lexicon and the language model, if any, loaded once; the lexicon's trie is compiled the first time a
    search needs it for a vocabulary size and device."""

    def __init__(self, lexicon: Lexicon, lm: NGramLM | None) -> None:
        self.lexicon = lexicon
        self.lm = lm
        self._tries: dict[tuple[int, str], LexiconTrie] = {}

    def trie(self, vocab_size: int, device: torch.device) -> LexiconTrie:
        key = (vocab_size, str(device))
        if key not in self._tries:
            self._tries[key] = LexiconTrie.build(self.lexicon, vocab_size, device)
        return self._tries[key]


class WordResourceCache:
    """The lexicons and language models one runner has loaded, by (lm, lexicon) path: loading a large LM takes
    seconds, so every request naming the same files shares one copy."""

    def __init__(self, tokenizer: Spelling) -> None:
        self.tokenizer = tokenizer
        self._loaded: dict[tuple[str | None, str | None], WordResources] = {}

    def get(self, lm_path: str | None, lexicon_path: str | None) -> WordResources:
        key = (lm_path, lexicon_path)
        if key not in self._loaded:
            lm = NGramLM(lm_path) if lm_path is not None else None
            if lexicon_path is not None:
                lexicon = Lexicon.from_file(lexicon_path, self.tokenizer)
            elif lm is not None and lm.is_arpa:
                lexicon = Lexicon.spelled(arpa_unigrams(lm.path), self.tokenizer)
            else:
                raise DecodingResourceError(f"{lm_path} is a binary language model: give a lexicon (one word a line)")
            if not lexicon.words:
                raise DecodingResourceError("the lexicon holds no word the model's tokenizer can spell")
            self._loaded[key] = WordResources(lexicon, lm)
        return self._loaded[key]


class CTCLexiconBeam(LaunchesEagerly):
    """The word-level search as a frame-synchronous strategy for one group of requests with the same options
    (``CTCPrefixBeam.with_words`` builds it)."""

    def __init__(self, resources: WordResources, options: LexiconBeamOptions) -> None:
        self.resources = resources
        self.options = options

    def decode(self, model: CTCModel, encoder_output: EncoderOutput) -> list[list[int]]:
        """encoder_output: hidden [B, T, D], lengths [B] -> the best hypothesis' tokens per row."""
        log_probs = model.ctc_log_probs(encoder_output.hidden)
        histories = LMHistories(self.resources.lm, self.resources.lexicon.words)
        trie = self.resources.trie(log_probs.shape[-1], log_probs.device)
        search = LexiconBeamSearch(trie, histories, model.blank_id, self.options)
        tokens, _, _ = search.run(log_probs, encoder_output.lengths)
        return tokens
