"""The language model's side of a word-level beam search: what a hypothesis carries about the words it has emitted,
and the score of each next word.

A hypothesis carries a ``history`` key (two hypotheses merge only with the same words, as flashlight numbers its LM
states per word history) and a ``context`` (the last words the language model conditions on; width 0 where the
model needs none). Two kinds:

- ``DeviceHistories``: no language model, or an ARPA file read into ``ArpaTables``. Keys are hashes of the word
  sequence and scores are computed on the device, so a frame never waits for the host.
- ``HostHistories``: a binary KenLM file, which only KenLM reads. Keys are numbered on the host as word sequences
  appear, and each frame asks KenLM for the pairs its candidates need (the frame's one sync).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from oasr.decode.arpa import BOS, EOS, NO_WORD, ArpaTables
from oasr.decode.lexicon import NGramLM

# Multiplier of the history hash (a 64-bit odd constant, as PCG's): keys of different word sequences collide with a
# chance of about 2^-64 per pair, far below anything a search meets.
_HASH_MULTIPLIER = 6364136223846793005


class WordHistories(Protocol):
    syncs: bool  # extend reads the device on the host: ask it only for candidates that can still matter
    context_width: int

    def start(self, batch: int, beam: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """-> the sentence start's (history [B, K] int64, context [B, K, C] int64)."""

    def extend(self, history: torch.Tensor, context: torch.Tensor, word: torch.Tensor, asked: torch.Tensor,
               group: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Each candidate's parent history [B, M], context [B, M, C] and word [B, M] (lexicon ids) -> its
        history, context and the word's log10 probability (float64) where ``asked``; candidates of one ``group``
        share a (history, word) pair. Elsewhere the values are unspecified."""

    def finish(self, history: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        """-> [B, K] float64: the log10 probability of ending the sentence after each history."""


class DeviceHistories:
    """Without a language model (``tables`` None: every score 0) or with an ARPA model's tables on the device."""

    syncs = False

    def __init__(self, tables: ArpaTables | None, words: Sequence[str], device: torch.device) -> None:
        self.tables = tables
        self.context_width = tables.order - 1 if tables is not None else 0
        ids = [tables.word_id(w) for w in words] if tables is not None else [0] * len(words)
        self._lm_ids = torch.tensor(ids or [0], dtype=torch.long, device=device)
        self._start = [NO_WORD] * (self.context_width - 1) + [tables.vocab[BOS]] if self.context_width else []
        self._end = tables.word_id(EOS) if tables is not None else 0

    def start(self, batch: int, beam: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        context = torch.tensor(self._start, dtype=torch.long, device=device).expand(batch, beam, -1).clone()
        return torch.zeros(batch, beam, dtype=torch.long, device=device), context

    def extend(self, history: torch.Tensor, context: torch.Tensor, word: torch.Tensor, asked: torch.Tensor,
               group: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        word = word.clamp(min=0)
        extended = (history ^ (word + 1)) * _HASH_MULTIPLIER  # int64 arithmetic wraps: a hash, not a number
        if self.tables is None:
            return extended, context, torch.zeros(word.shape, dtype=torch.float64, device=word.device)
        lm_word = self._lm_ids[word]
        log10 = self.tables.score(context, lm_word).double()
        return extended, torch.cat([context[..., 1:], lm_word[..., None]], -1), log10

    def finish(self, history: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        if self.tables is None:
            return torch.zeros(history.shape, dtype=torch.float64, device=history.device)
        return self.tables.score(context, torch.full_like(history, self._end)).double()


class HostHistories:
    """A KenLM model asked on the host: each distinct word history gets the next id, and KenLM's state for it."""

    syncs = True
    context_width = 0

    def __init__(self, lm: NGramLM, words: Sequence[str]) -> None:
        import kenlm

        self.lm = lm
        self.words = words
        self._next: dict[tuple[int, int], tuple[int, float]] = {}
        start = kenlm.State()
        lm.model.BeginSentenceWrite(start)
        self._states: list[object] = [start]
        self._kenlm_state = kenlm.State

    def start(self, batch: int, beam: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.zeros(batch, beam, dtype=torch.long, device=device),
                torch.zeros(batch, beam, 0, dtype=torch.long, device=device))

    def extend(self, history: torch.Tensor, context: torch.Tensor, word: torch.Tensor, asked: torch.Tensor,
               group: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # The first asked candidate of each group goes to the host and the rest read its answer.
        b, m = asked.shape
        slots = torch.arange(m, device=asked.device).expand(b, m)
        first = torch.full_like(group, m).scatter_reduce(1, group, torch.where(asked, slots, m), "amin")
        which = (asked & (first.gather(1, group) == slots)).view(-1).nonzero().squeeze(1)
        pairs = zip(history.view(-1)[which].tolist(), word.view(-1)[which].tolist(), strict=True)
        ids, scores = zip(*(self._advance(h, w) for h, w in pairs), strict=True) if len(which) else ((), ())
        # Answers land on their state's group id (row-major, as ``which`` indexes slots) and spread from there.
        at = (which // m) * m + group.view(-1)[which]
        extended = torch.zeros(b * m, dtype=torch.long, device=asked.device)
        extended[at] = torch.tensor(ids, dtype=torch.long).to(asked.device)
        log10 = torch.zeros(b * m, dtype=torch.float64, device=asked.device)
        log10[at] = torch.tensor(scores, dtype=torch.float64).to(asked.device)
        return extended.view(b, m).gather(1, group), context, log10.view(b, m).gather(1, group)

    def _advance(self, history: int, word: int) -> tuple[int, float]:
        hit = self._next.get((history, word))
        if hit is None:
            out = self._kenlm_state()
            score = self.lm.model.BaseScore(self._states[history], self.words[word], out)
            self._states.append(out)
            hit = self._next[(history, word)] = (len(self._states) - 1, score)
        return hit

    def finish(self, history: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        end = [[self.lm.model.BaseScore(self._states[h], EOS, self._kenlm_state()) for h in row]
               for row in history.tolist()]
        return torch.tensor(end, dtype=torch.float64, device=history.device)
