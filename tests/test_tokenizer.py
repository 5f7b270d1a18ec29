"""Whisper tokenizers resolve special tokens by name on both vocabularies and round-trip text."""

from __future__ import annotations

import pytest

from oasr.errors import UnsupportedOptionError

TEXTS = [
    " And so my fellow Americans, ask not what your country can do for you.",
    " Der hinter diesem Portal liegende Raum wurde als Leichenhalle genutzt.",
    " 客観的実在の判断的知識が整理するのである",
    " Бедняга. Ребят, на его месте должен быть я.",
    " emoji 🎙️ and tabs\tand  double  spaces",
]


def test_english_only_special_tokens(tiny_en) -> None:
    s = tiny_en.tokenizer.special
    assert (s.eot, s.sot, s.translate, s.transcribe, s.no_timestamps) == (50256, 50257, 50357, 50358, 50362)
    assert s.timestamp_begin == 50363
    assert tiny_en.config.is_multilingual is False


def test_multilingual_special_tokens(base_multilingual) -> None:
    s = base_multilingual.tokenizer.special
    assert (s.eot, s.sot, s.translate, s.transcribe, s.no_timestamps) == (50257, 50258, 50358, 50359, 50363)
    assert s.language_ids["en"] == 50259 and s.language_ids["de"] == 50261
    assert base_multilingual.config.is_multilingual and base_multilingual.config.num_languages == 99
    assert len(s.language_ids) == 99


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(tiny_en, base_multilingual, text: str) -> None:
    for loaded in (tiny_en, base_multilingual):
        ids = loaded.tokenizer.encode(text)
        assert ids and max(ids) < loaded.tokenizer.special.eot
        assert loaded.tokenizer.decode(ids) == text


def test_decode_drops_special_and_timestamp_tokens(base_multilingual) -> None:
    tok = base_multilingual.tokenizer
    s = tok.special
    ids = tok.encode(" hello world")
    framed = [s.sot, s.language_ids["en"], s.transcribe, s.timestamp_begin, *ids, s.timestamp_begin + 50, s.eot]
    assert tok.decode(framed) == " hello world"


def test_unknown_language_and_task_are_refused(base_multilingual) -> None:
    with pytest.raises(UnsupportedOptionError, match="klingon"):
        base_multilingual.tokenizer.language_id("klingon")
    with pytest.raises(UnsupportedOptionError, match="summarize"):
        base_multilingual.tokenizer.task_id("summarize")
