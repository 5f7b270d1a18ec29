"""ARPA n-gram tables scored on the device against KenLM's ``BaseScore`` on the same file: every context length,
sentence marks, words outside the vocabulary; and ARPA files that cannot be read are refused by name."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from oasr.bench.ctc_lm import lexicon_words, write_trigram_arpa
from oasr.decode.arpa import NO_WORD, ArpaTables
from oasr.decode.ctc_lexicon_beam import load_lm
from oasr.decode.lexicon import DecodingResourceError

kenlm = pytest.importorskip("kenlm")


def test_trigram_scores_are_kenlms_floats(tmp_path: Path) -> None:
    words = lexicon_words(1025, 300)
    arpa = write_trigram_arpa(tmp_path / "3gram.arpa", words, num_sentences=2000)
    tables, model = ArpaTables.read(arpa), kenlm.Model(str(arpa))
    assert tables.order == 3
    rng = random.Random(0)
    contexts, queries, want = [], [], []
    for _ in range(2000):
        history = [rng.choice([*words, "<s>", "not-a-word"]) for _ in range(rng.randint(0, 3))]
        word = rng.choice([*words, "</s>", "not-a-word"])
        state = kenlm.State()
        model.NullContextWrite(state)
        for w in history:
            out = kenlm.State()
            model.BaseScore(state, w, out)
            state = out
        want.append(model.BaseScore(state, word, kenlm.State()))
        context = [NO_WORD, NO_WORD, *(tables.word_id(w) for w in history)][-2:]
        contexts.append(context)
        queries.append(tables.word_id(word))
    got = tables.score(torch.tensor(contexts), torch.tensor(queries))
    assert got.tolist() == want  # the same float32 values, added in KenLM's order
    # The trigrams were used: a context of two words changes some scores against the last word alone.
    shortened = tables.score(torch.tensor([[NO_WORD, c[1]] for c in contexts]), torch.tensor(queries))
    assert (shortened != got).sum() >= 20


def test_unreadable_arpa_files_are_refused_naming_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.arpa"
    bad.write_text("\\data\\\nngram 1=2\n\n\\1-grams:\n-1.0\n\\end\\\n")
    with pytest.raises(DecodingResourceError, match=r"cannot read the language model .*bad\.arpa"):
        load_lm(bad)
    with pytest.raises(DecodingResourceError, match="language model file not found"):
        load_lm(tmp_path / "missing.arpa")
