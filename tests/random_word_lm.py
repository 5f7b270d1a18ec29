"""A small random lexicon and a bigram ARPA language model counted over random sentences of its words, for the
word-level beam's tests."""

from __future__ import annotations

import math
import random
from collections import Counter
from pathlib import Path

from oasr.decode.lexicon import Lexicon


def write_bigram_arpa(path: Path, sentences: list[list[str]]) -> Path:
    """A bigram ARPA file from counts: add-one unigrams (backoff log10 0.5), the seen bigrams at half their
    relative frequency. Not a tuned model, only a valid one whose scores differ from word to word."""
    unigrams, bigrams = Counter(), Counter()
    vocab = ["<s>", "</s>", "<unk>", *sorted({w for s in sentences for w in s})]
    for sentence in sentences:
        marked = ["<s>", *sentence, "</s>"]
        unigrams.update(marked[1:])
        bigrams.update(zip(marked, marked[1:]))
    total = sum(unigrams.values()) + len(vocab)
    contexts = Counter()
    for (first, _), count in bigrams.items():
        contexts[first] += count
    lines = ["\\data\\", f"ngram 1={len(vocab)}", f"ngram 2={len(bigrams)}", "", "\\1-grams:"]
    for w in vocab:
        p = -99.0 if w == "<s>" else math.log10((unigrams[w] + 1) / total)
        lines.append(f"{p:.6f}\t{w}" + ("" if w == "</s>" else f"\t{math.log10(0.5):.6f}"))
    lines += ["", "\\2-grams:"]
    lines += [f"{math.log10(0.5 * c / contexts[a]):.6f}\t{a} {b}" for (a, b), c in sorted(bigrams.items())]
    path.write_text("\n".join([*lines, "", "\\end\\", ""]), encoding="utf-8")
    return path


def random_lexicon_and_lm(tmp_path: Path, rng: random.Random, blank: int) -> tuple[Lexicon, Path]:
    """40 distinct spellings of 1-3 tokens below ``blank`` as words w0..w39, and a bigram LM counted over random
    sentences of them."""
    spellings: dict[tuple[int, ...], str] = {}
    while len(spellings) < 40:
        spellings.setdefault(tuple(rng.randrange(blank) for _ in range(rng.randint(1, 3))), f"w{len(spellings)}")
    lexicon = Lexicon(tuple(spellings.values()), tuple(spellings))
    arpa = write_bigram_arpa(tmp_path / "lm.arpa",
                             [[rng.choice(lexicon.words) for _ in range(rng.randint(2, 6))] for _ in range(60)])
    return lexicon, arpa
