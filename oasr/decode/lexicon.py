"""Word-level decoding resources: the lexicon (each word's spelling in model tokens, compiled into a trie of device
tensors) and the n-gram language model opened through KenLM (a binary file; ``oasr.decode.arpa`` reads ARPA text
into device tables instead).

The lexicon limits the words a search can emit; the language model scores each word as it completes. Both are
built once per (model, files) and shared, read-only, by every search that asks for them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from oasr.errors import OASRError


class DecodingResourceError(OASRError):
    """A lexicon or language-model file that is missing or cannot be read."""


class Spelling(Protocol):
    """What a lexicon needs of the model's tokenizer."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, token_ids: list[int]) -> str: ...


@dataclass(frozen=True)
class Lexicon:
    """``words[i]`` is spelled by the token ids ``spellings[i]``; a word may appear more than once (several
    spellings)."""

    words: tuple[str, ...]
    spellings: tuple[tuple[int, ...], ...]

    @classmethod
    def spelled(cls, words: Iterable[str], tokenizer: Spelling) -> Lexicon:
        """Each word spelled as the model's tokenizer writes it. A word whose spelling does not decode back to it
        (a character the vocabulary lacks becomes <unk>) is left out: the search could only emit it garbled."""
        kept = [(w, tuple(tokenizer.encode(w))) for w in dict.fromkeys(words)]
        kept = [(w, s) for w, s in kept if s and tokenizer.decode(list(s)).strip() == w]
        return cls(tuple(w for w, _ in kept), tuple(s for _, s in kept))

    @classmethod
    def from_file(cls, path: str | Path, tokenizer: Spelling) -> Lexicon:
        """One word per line (anything after the first whitespace is ignored), spelled by the tokenizer."""
        path = Path(path)
        if not path.is_file():
            raise DecodingResourceError(f"lexicon file not found: {path}")
        words = [line.split()[0] for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        if not words:
            raise DecodingResourceError(f"lexicon {path} lists no words")
        return cls.spelled(words, tokenizer)

    def word_ids(self) -> dict[str, int]:
        """The first id of each word (the language model scores words by name)."""
        ids: dict[str, int] = {}
        for i, w in enumerate(self.words):
            ids.setdefault(w, i)
        return ids


@dataclass(frozen=True)
class LexiconTrie:
    """The lexicon as a token trie, node 0 the root. ``child``: [N, V] int64, the node a token leads to (-1: none);
    ``has_children``: [N] bool; ``labels``: [N, L] int64, the words whose spelling ends at a node (-1 pads);
    ``parent``: [N] int64, the node each node hangs from (-1 for the root)."""

    child: torch.Tensor
    has_children: torch.Tensor
    labels: torch.Tensor
    parent: torch.Tensor

    @classmethod
    def build(cls, lexicon: Lexicon, vocab_size: int, device: torch.device | str = "cpu") -> LexiconTrie:
        children: list[dict[int, int]] = [{}]
        labels: list[list[int]] = [[]]
        for word, spelling in enumerate(lexicon.spellings):
            node = 0
            for token in spelling:
                if not 0 <= token < vocab_size:
                    raise DecodingResourceError(f"lexicon word {lexicon.words[word]!r} is spelled with token {token}, "
                                      f"outside the model's {vocab_size} tokens")
                nxt = children[node].get(token)
                if nxt is None:
                    nxt = children[node][token] = len(children)
                    children.append({})
                    labels.append([])
                node = nxt
            labels[node].append(word)
        child = torch.full((len(children), vocab_size), -1, dtype=torch.long)
        parent = torch.full((len(children),), -1, dtype=torch.long)
        for node, edges in enumerate(children):
            for token, target in edges.items():
                child[node, token] = target
                parent[target] = node
        width = max(1, max(len(ls) for ls in labels))
        label_table = torch.full((len(labels), width), -1, dtype=torch.long)
        for node, ls in enumerate(labels):
            label_table[node, : len(ls)] = torch.tensor(ls, dtype=torch.long)
        return cls(child.to(device), (child >= 0).any(1).to(device), label_table.to(device), parent.to(device))


def arpa_unigrams(path: str | Path) -> list[str]:
    """The words of an ARPA file's 1-gram section, without the sentence marks and <unk>."""
    words: list[str] = []
    in_unigrams = False
    with Path(path).open(encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.strip()
            if line.startswith("\\"):
                if in_unigrams:
                    break
                in_unigrams = line == "\\1-grams:"
                continue
            if in_unigrams and line:
                parts = line.split()
                if len(parts) >= 2 and parts[1] not in ("<s>", "</s>", "<unk>"):
                    words.append(parts[1])
    return words


class NGramLM:
    """A KenLM model. Scores are KenLM's log10 probabilities, as flashlight and torchaudio fuse them."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise DecodingResourceError(f"language model file not found: {self.path}")
        try:
            import kenlm  # only searches with a language model need it
        except ImportError:
            raise DecodingResourceError("a language model needs the kenlm package: pip install 'oasr[lm]'") from None

        try:
            self.model = kenlm.Model(str(self.path))
        except (OSError, RuntimeError) as e:
            raise DecodingResourceError(f"cannot read the language model {self.path}: {e}") from e
