"""FunASR's token-to-text rules (``oasr.tokenizers.funasr_text``) against FunASR's own ``sentence_postprocess``.

tests/data/funasr/text_rules.json holds, for hand-made token lists that walk every branch (Chinese only, English
words and ``@@`` pieces, single-letter abbreviations, mixed, dropped and untimed tokens), what funasr 1.4.16 gave
with and without per-token times (scripts/funasr_oracle/build_models.py; CI never runs FunASR).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oasr.tokenizers.funasr_text import sentence_words

CASES = json.loads((Path(__file__).parent / "data" / "funasr" / "text_rules.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("case", CASES, ids=lambda c: " ".join(c["tokens"]))
def test_text_and_words_are_funasrs(case: dict) -> None:
    plain = sentence_words(case["tokens"])
    assert (plain.text, list(plain.words)) == (case["text"], case["words"])


@pytest.mark.parametrize("case", CASES, ids=lambda c: " ".join(c["tokens"]))
def test_timed_words_and_spans_are_funasrs(case: dict) -> None:
    timed = sentence_words(case["tokens"], case["spans"])
    assert timed.text == case["timed_text"] and list(timed.words) == case["timed_words"]
    assert [list(span) for span in timed.spans] == case["timed_spans"]
