"""Hotwords (context biasing): phrases whose tokens a beam search rewards as a hypothesis spells them.

The phrases, as token sequences, make an Aho-Corasick automaton (a trie with failure links), flattened into a
table of transitions over the whole vocabulary so that a search advances every hypothesis with one gather, as
icefall's and sherpa-onnx's ``ContextGraph`` do on the host. A hypothesis earns a phrase's boost for each token
of it that it spells; when the next token breaks the match it falls back along the failure links and gives back
the boost of the tokens it no longer matches; a completed phrase keeps its boost and matching starts again at
the root. At the end of the search an unfinished match gives its boost back, so only whole phrases count.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from oasr.types import Hotword, HotwordsError


@dataclass(frozen=True)
class HostAutomaton:
    """The same automaton on the host, as the trie it was built from: what a search that reads its hypotheses on
    the host needs to tell a hypothesis' boost from its score (``kept_boost``), without the [S, V] tables."""

    children: tuple[dict[int, int], ...]
    fail: tuple[int, ...]
    held: tuple[float, ...]  # boost accumulated from the root to each state
    is_end: tuple[bool, ...]

    def kept_boost(self, tokens: Sequence[int]) -> float:
        """The boost ``tokens`` keep at the end: that of the phrases they complete. (The table walk adds the
        same gains token by token; its sum is this plus ``open_boost``.)"""
        total, state = self._walk(tokens)
        return total - self.held[state]

    def open_boost(self, tokens: Sequence[int]) -> float:
        """The boost of the match still open after ``tokens``, which an ending would give back."""
        return self.held[self._walk(tokens)[1]]

    def _walk(self, tokens: Sequence[int]) -> tuple[float, int]:
        """-> (the gains the tables add along ``tokens``, the state they end in)."""
        state, total = 0, 0.0
        for token in tokens:
            target = self._goto(state, token)
            total += self.held[target] - self.held[state]
            state = 0 if self.is_end[target] else target
        return total, state

    def _goto(self, state: int, token: int) -> int:
        while state and token not in self.children[state]:
            state = self.fail[state]
        return self.children[state].get(token, 0)


@dataclass(frozen=True)
class ContextGraph:
    """The automaton as tables on a device, state 0 the root. ``next_state``: [S, V] int64, the state after a
    token; ``gain``: [S, V] float32, the score that token adds (negative when it breaks a match); ``pending``:
    [S] float32, the boost an unfinished match in that state holds (given back at the end). ``host``: the same
    automaton for host-side bookkeeping."""

    next_state: torch.Tensor
    gain: torch.Tensor
    pending: torch.Tensor
    host: HostAutomaton

    @classmethod
    def build(cls, phrases: Sequence[tuple[Sequence[int], float]], vocab_size: int,
              device: torch.device | str = "cpu") -> ContextGraph:
        """phrases: (token ids, boost per token) each."""
        children: list[dict[int, int]] = [{}]
        token_boost = [0.0]  # what each state's token adds; phrases sharing a prefix share the larger boost
        is_end = [False]
        for tokens, boost in phrases:
            node = 0
            for token in tokens:
                if not 0 <= token < vocab_size:
                    raise HotwordsError(f"hotword token {token} is outside the model's {vocab_size} tokens")
                nxt = children[node].get(token)
                if nxt is None:
                    nxt = children[node][token] = len(children)
                    children.append({})
                    token_boost.append(boost)
                    is_end.append(False)
                token_boost[nxt] = max(token_boost[nxt], boost)
                node = nxt
            is_end[node] = True
        num_states = len(children)
        held = [0.0] * num_states  # boost accumulated from the root to each state
        # One row per state, filled in breadth-first order: a state's failure state is shallower, so its row is
        # complete when the state copies it (tokens without a child of their own follow the failure link).
        target = torch.zeros(num_states, vocab_size, dtype=torch.long)
        fail = [0] * num_states
        order = deque([0])
        while order:
            state = order.popleft()
            if state:
                target[state] = target[fail[state]]
            for token, child in children[state].items():
                fail[child] = int(target[fail[state], token]) if state else 0
                held[child] = held[state] + token_boost[child]
                target[state, token] = child
                order.append(child)
        held_t = torch.tensor(held, dtype=torch.float32)
        gain = held_t[target] - held_t[:, None]
        # A completed phrase keeps its boost: matching starts over at the root.
        next_state = torch.where(torch.tensor(is_end)[target], 0, target)
        host = HostAutomaton(tuple(children), tuple(fail), tuple(held), tuple(is_end))
        return cls(next_state.to(device), gain.to(device), held_t.to(device), host)

    def advance(self, state: torch.Tensor, held: torch.Tensor, token: torch.Tensor,
                emitted: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Hypotheses' automaton states and boosts held (same shapes) after ``token`` where ``emitted``; the rest
        (a blank, no token) keep theirs."""
        token = torch.where(emitted, token, 0)
        return (torch.where(emitted, self.next_state[state, token], state),
                torch.where(emitted, held + self.gain[state, token], held))

    def kept(self, state: torch.Tensor, held: torch.Tensor) -> torch.Tensor:
        """The boost hypotheses keep if they end here: what they hold, less the match still open."""
        return held - self.pending[state]


def spelled_in_text(encode: Callable[[str], list[int]]) -> Callable[[str], list[int]]:
    """``encode`` -> the tokens of a phrase as it reads after a word in running text, which is how a decoder writes
    it. Byte-level BPE vocabularies (Whisper's) mark a word's start by the space before it and SentencePiece ones
    by a marker the tokenizer adds at the start of any text; spelling the phrase after a one-letter word and
    dropping that word's tokens gets both right."""
    def spell(phrase: str) -> list[int]:
        return encode("a " + phrase)[len(encode("a")):]

    return spell


class ContextGraphCache:
    """The automata one runner has compiled, by hotword list, vocabulary size and device: a server's clients
    tend to send the same list with every request."""

    def __init__(self, encode) -> None:
        self.encode = encode  # the model tokenizer's text -> token ids
        self._graphs: dict[tuple, ContextGraph] = {}

    def get(self, hotwords: tuple[Hotword, ...], vocab_size: int, device: torch.device) -> ContextGraph:
        key = (hotwords, vocab_size, str(device))
        if key not in self._graphs:
            phrases = [(self.encode(h.phrase), h.boost) for h in hotwords]
            self._graphs[key] = ContextGraph.build([p for p in phrases if p[0]], vocab_size, device)
        return self._graphs[key]
