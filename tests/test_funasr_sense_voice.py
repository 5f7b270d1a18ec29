"""FunASR's SenseVoice-Small through ``oasr transcribe``, against FunASR's own outputs.

tests/data/funasr/sense_voice/ is a tiny random SenseVoiceSmall built with funasr's own classes and saved as
SenseVoice-Small's folder is (config.yaml, configuration.json, model.pt, am.mvn and the SentencePiece model with
SenseVoice's tags); sense_voice.json holds what funasr 1.4.16's ``AutoModel(model=DIR).generate(language=...,
use_itn=...)`` gave on three shared clips for auto and forced languages, ITN on and off, and the token ids its
inference decoded them from. scripts/funasr_oracle/build_models.py made them; CI never runs FunASR.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from oasr.cli import main
from tests.speech_data import audio_path, require_speech_data

DATA = Path(__file__).parent / "data" / "funasr"
MODEL = DATA / "sense_voice"
TAG = re.compile(r"<\|[^|]*\|>")
LANGUAGE_TAG = re.compile(r"<\|(zh|en|yue|ja|ko)\|>")


def golden() -> dict:
    return json.loads((DATA / "sense_voice.json").read_text(encoding="utf-8"))


def clip_paths() -> list[str]:
    by_id = {e["id"]: e for e in require_speech_data()}
    return [str(audio_path(by_id[name])) for name in golden()["clips"]]


def flags(run: dict) -> list[str]:
    language = [] if run["language"] == "auto" else ["--language", run["language"]]
    return language + ([] if run["use_itn"] else ["--no-punctuation"])


@pytest.mark.parametrize("index", range(len(golden()["runs"])))
def test_sense_voice_gives_funasrs_tokens_for_each_language_and_itn(index: int, capsys) -> None:
    run = golden()["runs"][index]
    assert all(len(ids) > 5 for ids in run["token_ids"])
    assert main(["transcribe", *clip_paths(), "--model", str(MODEL), "--device", "cpu", "--dtype", "float32",
                 "--output-format", "jsonl", "--quiet", *flags(run)]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert [row["token_ids"] for row in rows] == run["token_ids"]
    # FunASR's text writes the tags (<|en|>, <|NEUTRAL|>, <|woitn|> ...); OASR's text is the rest of it.
    assert [row["text"] for row in rows] == [TAG.sub("", text).strip() for text in run["texts"]]
    # A forced language is reported as asked; auto reports the first language tag the model wrote.
    found = [LANGUAGE_TAG.search(text) for text in run["texts"]]
    expected = [m.group(1) if m else None for m in found] if run["language"] == "auto" else [run["language"]] * 3
    assert [row["language"] for row in rows] == expected


def test_runs_differ_so_the_queries_are_read() -> None:
    runs = golden()["runs"]
    assert len({json.dumps(run["token_ids"]) for run in runs}) == len(runs)


def test_a_language_sense_voice_has_no_query_for_is_refused(capsys) -> None:
    assert main(["transcribe", clip_paths()[0], "--model", str(MODEL), "--device", "cpu", "--quiet",
                 "--language", "fr"]) != 0
    assert "SenseVoice does not serve language 'fr'" in capsys.readouterr().err


def test_the_folder_maps_to_sense_voice_with_its_sentencepiece_model() -> None:
    from oasr.models.loader import read_checkpoint, resolve_source

    checkpoint = read_checkpoint(resolve_source(MODEL))
    assert checkpoint.architecture == "sense_voice" and checkpoint.format == "funasr"
    assert checkpoint.tokenizer_file.name == "chn_jpn_yue_eng_ko_spectok.bpe.model"
