"""An ARPA n-gram model as sorted device tensors, so a search scores its words on the device without asking the
host each frame.

Each order's n-grams are numbered by their place in a sorted key array: the key of ``w1 .. wk`` is the number of
``w1 .. wk-1`` among the (k-1)-grams times the vocabulary size plus ``wk`` (unigrams are numbered by word id), so a
lookup is one ``searchsorted`` per order. A word's log10 probability after a context follows the ARPA back-off rule
(the longest n-gram that exists, plus the back-off weights of the longer contexts that do not end in it), added in
float32 in the order KenLM adds them, so a score here is the float KenLM's ``BaseScore`` returns. As in KenLM, a
word outside the vocabulary is ``<unk>``, whose log10 probability is -100 where the file lists none.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

UNK, BOS, EOS = "<unk>", "<s>", "</s>"
MISSING_UNK_LOG10 = -100.0  # KenLM's probability for <unk> when the ARPA file has no entry for it
NO_WORD = -1  # a context position before the sentence's first word


class ArpaError(ValueError):
    """An ARPA file this reader cannot use."""


def is_arpa(path: str | Path) -> bool:
    """Whether the file opens as ARPA text does (its first line ``\\data\\``), not as a binary model."""
    with Path(path).open("rb") as f:
        return f.read(64).lstrip().startswith(b"\\data\\")


@dataclass(frozen=True)
class ArpaTables:
    """``keys[k]``, ``log10[k]``, ``backoff[k]``: the (k+1)-grams sorted by key (unigrams: by word id, key = id)."""

    vocab: dict[str, int]
    keys: tuple[torch.Tensor, ...]
    log10: tuple[torch.Tensor, ...]
    backoff: tuple[torch.Tensor, ...]

    @property
    def order(self) -> int:
        return len(self.keys)

    @property
    def device(self) -> torch.device:
        return self.keys[0].device

    def word_id(self, word: str) -> int:
        return self.vocab.get(word, self.vocab[UNK])

    @classmethod
    def read(cls, path: str | Path) -> ArpaTables:
        grams = read_sections(Path(path))
        vocab = {g[0]: i for i, g in enumerate(grams[0])}
        if UNK not in vocab:
            vocab[UNK] = len(vocab)
            grams[0][(UNK,)] = (MISSING_UNK_LOG10, 0.0)
        size = len(vocab)
        numbers: dict[tuple[str, ...], int] = {(w,): i for w, i in vocab.items()}
        keys = [np.arange(size, dtype=np.int64)]
        log10, backoff = [np.zeros(size, np.float32)], [np.zeros(size, np.float32)]
        for (w,), (p, b) in grams[0].items():
            log10[0][vocab[w]], backoff[0][vocab[w]] = p, b
        for section in grams[1:]:
            order_keys, kept = [], []
            for gram, values in section.items():
                prefix = numbers.get(gram[:-1])
                if prefix is None or gram[-1] not in vocab:
                    continue  # an n-gram whose context is not listed one order down can never be reached
                order_keys.append(prefix * size + vocab[gram[-1]])
                kept.append((gram, values))
            order = np.argsort(np.array(order_keys, dtype=np.int64), kind="stable")
            keys.append(np.array(order_keys, dtype=np.int64)[order])
            log10.append(np.array([kept[i][1][0] for i in order], dtype=np.float32))
            backoff.append(np.array([kept[i][1][1] for i in order], dtype=np.float32))
            numbers = {kept[i][0]: place for place, i in enumerate(order)}
        return cls(vocab, *(tuple(torch.from_numpy(a) for a in arrays) for arrays in (keys, log10, backoff)))

    def to(self, device: torch.device | str) -> ArpaTables:
        return ArpaTables(self.vocab, *(tuple(t.to(device) for t in tensors)
                                        for tensors in (self.keys, self.log10, self.backoff)))

    def _lookup(self, order: int, prefix: torch.Tensor, word: torch.Tensor) -> torch.Tensor:
        """The number of the ``order``-gram (prefix's n-gram, word) (``order`` >= 2), or -1 where there is none."""
        keys = self.keys[order - 1]
        if len(keys) == 0:
            return torch.full_like(word, -1)
        query = torch.where((prefix >= 0) & (word >= 0), prefix * len(self.vocab) + word, -1)
        place = torch.searchsorted(keys, query).clamp(max=len(keys) - 1)
        return torch.where(keys[place] == query, place, -1)

    def score(self, context: torch.Tensor, word: torch.Tensor) -> torch.Tensor:
        """context: [..., order - 1] word ids, oldest first (``NO_WORD`` before the sentence's start); word: [...]
        -> log10 P(word | context), float32 [...]."""
        width = context.shape[-1]
        # suffix[j]: the number of the context's last j words as a j-gram (-1: not listed); j = 0 is the empty one.
        suffix: list[torch.Tensor | None] = [None]
        for j in range(1, width + 1):
            number = context[..., width - j]
            for m in range(2, j + 1):
                number = self._lookup(m, number, context[..., width - j + m - 1])
            suffix.append(number)
        total = self.log10[0][word]
        for j in range(1, width + 1):
            extended = self._lookup(j + 1, suffix[j], word)
            found = extended >= 0
            backoff = torch.where(suffix[j] >= 0, self.backoff[j - 1][suffix[j].clamp(min=0)], 0.0)
            total = torch.where(found, self.log10[j][extended.clamp(min=0)], total + backoff)
        return total


def read_sections(path: Path) -> list[dict[tuple[str, ...], tuple[float, float]]]:
    """The n-gram sections of an ARPA file: per order, each n-gram's (log10 probability, back-off weight)."""
    grams: list[dict[tuple[str, ...], tuple[float, float]]] = []
    current = 0
    with path.open(encoding="utf-8", errors="replace") as f:
        for raw in f:
            line = raw.strip()
            if not line:
                continue
            if line.startswith("\\"):
                if line.endswith("-grams:"):
                    current = int(line[1:].split("-", 1)[0])
                    if current != len(grams) + 1:
                        raise ArpaError(f"{path}: section {line} out of order")
                    grams.append({})
                elif line == "\\end\\":
                    break
                continue
            if current == 0:
                continue  # the \data\ counts
            parts = line.split()
            if len(parts) not in (current + 1, current + 2):
                raise ArpaError(f"{path}: cannot read the {current}-gram line {line!r}")
            grams[-1][tuple(parts[1 : current + 1])] = (float(parts[0]),
                                                        float(parts[current + 1]) if len(parts) == current + 2 else 0.0)
    if not grams:
        raise ArpaError(f"{path}: no n-gram sections")
    return grams
