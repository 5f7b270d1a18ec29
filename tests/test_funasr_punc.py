"""FunASR's CT-Transformer punctuation against FunASR's own on a tiny random model built with funasr's
``CTTransformer`` (tests/data/funasr/ct_punc.json, made by scripts/funasr_oracle/build_punc.py): the text each
unpunctuated input is written as, and the writing rules on scripted classes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from oasr.errors import CheckpointError
from oasr.models.ct_punc.text import punctuate_words, split_words
from oasr.models.punctuation import PUNCTUATORS

DATA = Path(__file__).parent / "data" / "funasr"
PUNC_LIST = ("<unk>", "_", "，", "。", "？", "、")


@pytest.fixture(scope="module")
def golden() -> dict:
    return json.loads((DATA / "ct_punc.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def punctuator():
    return PUNCTUATORS.get("ct_transformer").load(DATA / "ct_punc")


def test_punctuated_texts_equal_funasr(golden, punctuator):
    cases = golden["texts"]
    results = punctuator.punctuate([case["input"] for case in cases])
    assert [r.text for r in results] == [case["text"] for case in cases]
    # the goldens exercise what they should: texts past one mini-sentence, each mark, English and Chinese
    assert max(len(split_words(case["input"])) for case in cases) > 5 * golden["split_size"]
    joined = "".join(case["text"] for case in cases)
    assert all(mark in joined for mark in ("，", "。", "？", "、", ",", ".", "?"))


def test_paraformer_transcripts_punctuated_as_funasr(golden, punctuator):
    texts = json.loads((DATA / "paraformer.json").read_text(encoding="utf-8"))["texts"]
    assert [r.text for r in punctuator.punctuate(texts)] == golden["paraformer"]["texts"]


def test_letters_keep_the_input_characters_in_order(punctuator):
    text = "我们用iphone打电话 and then we go home"
    [result] = punctuator.punctuate([text])
    assert result.letters.lower() == "".join(text.split()).lower()
    assert len(result.marks) == len(result.letters)


def test_scripted_classes_are_written_as_funasr_writes_them(golden, punctuator):
    """FunASR's inference fed fixed classes per word: carried mini-sentences, a comma cut past 200 carried words,
    English spacing at run starts, the last mark rewritten (a "<unk>" mark too)."""
    scripted_golden = golden["scripted"]
    by_id = {punctuator.vocabulary[word]: mark for word, mark in scripted_golden["classes"].items()}
    config = punctuator.config
    for text, expected in zip(scripted_golden["inputs"], scripted_golden["texts"], strict=True):
        words = split_words(text)
        ids = [punctuator.vocabulary.get(word, punctuator.unk_id) for word in words]
        written = punctuate_words(words, ids, lambda batch: [by_id.get(i, 1) for i in batch], config.punc_list,
                                  config.sentence_end_id)
        assert written.text == expected
    assert any(len(split_words(text)) > 200 for text in scripted_golden["inputs"])


def scripted(classes: list[int]):
    """A classifier that hands out ``classes`` in order, one per word it is asked about (carried words again)."""
    remaining = iter(classes)
    return lambda ids: [next(remaining) for _ in ids]


def test_a_sentence_end_keeps_the_words_before_it_and_carries_the_rest():
    words = [f"w{i}" for i in range(25)]
    # first mini-sentence (20 words): a period after word 5, nothing else; the carried 14 words come back first
    first = [1] * 20
    first[5] = 3
    second = [1] * 19
    result = punctuate_words(words, list(range(25)), scripted(first + second), PUNC_LIST, 3, split_size=20)
    # a carried run starts a written run: its first word is capitalised and spaced, and the text ends with "."
    assert result.text == " W0 w1 w2 w3 w4 w5. W6 " + " ".join(words[7:]) + "."


def test_a_long_run_without_a_sentence_end_is_cut_at_its_last_comma():
    words = ["字"] * 230
    carried, script = 0, []
    for _ in range(11):  # ten mini-sentences carried whole, the eleventh cut
        length = carried + 20
        row = [1] * length
        if length > 200:
            row[150] = 2  # a comma: the cut, turned into a sentence end
        script.extend(row)
        carried = length if length <= 200 else length - 151
    script.extend([1] * (carried + 10))
    result = punctuate_words(words, [0] * 230, scripted(script), PUNC_LIST, 3, split_size=20)
    assert result.marks[150] == "。" and result.marks.count("。") == 2 and result.marks[-1] == "。"


def test_a_folder_that_is_not_a_ct_transformer_is_refused(tmp_path):
    with pytest.raises(CheckpointError, match="field model is 'Paraformer'"):
        PUNCTUATORS.get("ct_transformer").load(DATA / "paraformer")
    folder = tmp_path / "punc"
    shutil.copytree(DATA / "ct_punc", folder)
    config = yaml.safe_load((folder / "config.yaml").read_text(encoding="utf-8"))
    config["encoder_conf"]["input_layer"] = "conv2d"
    (folder / "config.yaml").write_text(yaml.safe_dump(config, allow_unicode=True), encoding="utf-8")
    with pytest.raises(CheckpointError, match="encoder_conf.input_layer is 'conv2d'"):
        PUNCTUATORS.get("ct_transformer").load(folder)
    with pytest.raises(CheckpointError, match="no config.yaml"):
        PUNCTUATORS.get("ct_transformer").load(tmp_path)
    config["encoder_conf"]["input_layer"] = "pe"
    config["model_conf"]["jieba_usr_dict"] = "jieba_usr_dict"
    (folder / "config.yaml").write_text(yaml.safe_dump(config, allow_unicode=True), encoding="utf-8")
    with pytest.raises(CheckpointError, match="model_conf.jieba_usr_dict is set"):
        PUNCTUATORS.get("ct_transformer").load(folder)
    del config["model_conf"]["jieba_usr_dict"]
    (folder / "config.yaml").write_text(yaml.safe_dump(config, allow_unicode=True), encoding="utf-8")
    (folder / "tokens.json").write_text('["<unk>", "a"]', encoding="utf-8")
    with pytest.raises(CheckpointError, match="shapes differ"):
        PUNCTUATORS.get("ct_transformer").load(folder)
    (folder / "jieba_usr_dict").write_text("", encoding="utf-8")
    with pytest.raises(CheckpointError, match="word-level CT-Transformer"):
        PUNCTUATORS.get("ct_transformer").load(folder)
