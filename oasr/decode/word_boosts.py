"""Hotwords for the word-level CTC search (``oasr.decode.ctc_lexicon_beam``): phrases of lexicon words, boosted
word by word as hypotheses complete them.

The word-level search writes whole words, so its hotword automaton reads words, not tokens: the same
Aho-Corasick tables as the token-level searches use (``oasr.decode.hotwords.ContextGraph``), over one symbol per
distinct lexicon word (a word with several spellings is one symbol). A hypothesis earns a phrase's boost for each
of its words as it completes them, gives back what a broken match earned, and at the end gives back an unfinished
match's, so only whole phrases count. A word the lexicon lacks can never be written, and is refused by name.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from oasr.decode.hotwords import ContextGraph
from oasr.decode.lexicon import Lexicon
from oasr.types import Hotword, HotwordsError


@dataclass(frozen=True)
class WordBoosts:
    """``graph``: the automaton over word symbols; ``symbol``: [lexicon entries] int64, each entry's word symbol."""

    graph: ContextGraph
    symbol: torch.Tensor

    @classmethod
    def build(cls, hotwords: Sequence[Hotword], lexicon: Lexicon, device: torch.device | str) -> WordBoosts:
        symbols: dict[str, int] = {}
        for word in lexicon.words:
            symbols.setdefault(word, len(symbols))
        phrases = []
        for hotword in hotwords:
            words = []
            for word in hotword.phrase.split():
                found = symbols.get(word, symbols.get(word.lower()))
                if found is None:
                    raise HotwordsError(f"hotword {hotword.phrase!r}: the lexicon has no word {word!r}, so the "
                                        "word-level search can never write it")
                words.append(found)
            phrases.append((words, hotword.boost))
        symbol = torch.tensor([symbols[word] for word in lexicon.words], dtype=torch.long)
        return cls(ContextGraph.build(phrases, len(symbols), device), symbol.to(device))
