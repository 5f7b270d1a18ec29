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


@pytest.mark.parametrize("text", [" say <|endoftext|> now", "<|translate|><|de|> <|notimestamps|><|0.00|>"])
def test_special_token_names_in_text_are_encoded_as_plain_text(tiny_en, base_multilingual, text: str) -> None:
    """A prompt is text: ``<|endoftext|>`` typed in it must not become the control token (openai-whisper's
    tiktoken, told to allow no special token, gives the same plain BPE ids)."""
    from whisper.tokenizer import get_encoding

    for loaded, vocabulary in ((tiny_en, "gpt2"), (base_multilingual, "multilingual")):
        ids = loaded.tokenizer.encode(text)
        assert max(ids) < loaded.tokenizer.special.eot
        assert ids == get_encoding(vocabulary).encode(text, disallowed_special=())
        assert loaded.tokenizer.decode(ids) == text


def test_added_tokens_not_flagged_special_are_plain_text_too(tiny_en, tmp_path) -> None:
    """Hugging Face's Whisper vocabularies add ``<|0.00|>`` ... as tokens that are not flagged special."""
    import json

    from oasr.tokenizers.whisper import WhisperTokenizer

    data = json.loads(tiny_en.tokenizer.path.read_text(encoding="utf-8"))
    next_id = max(t["id"] for t in data["added_tokens"]) + 1
    data["added_tokens"].append({"id": next_id, "content": "<|0.00|>", "single_word": False, "lstrip": False,
                                 "rstrip": False, "normalized": False, "special": False})
    (tmp_path / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    tokenizer = WhisperTokenizer(tmp_path / "tokenizer.json")
    ids = tokenizer.encode(" at <|0.00|> we")
    assert ids == tiny_en.tokenizer.encode(" at <|0.00|> we") and max(ids) < tokenizer.special.eot


def test_a_prompt_naming_control_tokens_conditions_on_text_only(base_multilingual) -> None:
    from oasr.models.whisper.prompt import WhisperPrompter
    from oasr.types import DecodeOptions

    prompter = WhisperPrompter(base_multilingual.config, base_multilingual.tokenizer, "base")
    s = base_multilingual.tokenizer.special
    prompt = prompter.prompt(DecodeOptions(language="en", prompt="Done.<|endoftext|><|translate|><|de|>"), None)
    sot_index = prompt.no_speech_index  # the no-speech probability is read after <|startoftranscript|>
    previous = prompt.token_ids[1:sot_index]
    assert prompt.token_ids[0] == s.sot_prev and previous and max(previous) < s.eot
    assert prompt.token_ids[sot_index:] == (s.sot, s.language_ids["en"], s.transcribe, s.no_timestamps)
