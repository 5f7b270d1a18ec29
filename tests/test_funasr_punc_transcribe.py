"""``--punctuate`` end to end: the tiny Paraformer's transcripts of the shared clips punctuated by the tiny
CT-Transformer print what FunASR's CT-Transformer writes for FunASR's own Paraformer text
(tests/data/funasr/ct_punc.json's ``paraformer``, made by scripts/funasr_oracle/build_punc.py); words keep their
CIF times; a model that writes its own punctuation is refused."""

from __future__ import annotations

import json
from pathlib import Path

from oasr.cli import main
from tests.speech_data import audio_path, require_speech_data

DATA = Path(__file__).parent / "data" / "funasr"
PARAFORMER = DATA / "paraformer"
PUNC = DATA / "ct_punc"


def golden() -> dict:
    return json.loads((DATA / "ct_punc.json").read_text(encoding="utf-8"))


def clip_paths() -> list[str]:
    by_id = {e["id"]: e for e in require_speech_data()}
    return [str(audio_path(by_id[name])) for name in golden()["paraformer"]["clips"]]


def transcribe(capsys, *extra: str) -> list[dict]:
    assert main(["transcribe", *clip_paths(), "--model", str(PARAFORMER), "--device", "cpu", "--dtype", "float32",
                 "--output-format", "jsonl", "--quiet", "--punctuate", str(PUNC), *extra]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]


def test_transcribe_punctuate_prints_funasrs_punctuated_paraformer_text(capsys) -> None:
    rows = transcribe(capsys)
    # OASR's texts are stripped; FunASR's start with a space where the first word is English
    assert [row["text"] for row in rows] == [text.strip() for text in golden()["paraformer"]["texts"]]
    for row in rows:
        assert "".join(segment["text"] for segment in row["segments"]) == row["text"]


def test_punctuated_words_keep_their_times(capsys) -> None:
    plain = json.loads((DATA / "paraformer.json").read_text(encoding="utf-8"))
    rows = transcribe(capsys, "--word-timestamps")
    for row, spans, text in zip(rows, plain["word_timestamps"], plain["timestamp_texts"], strict=True):
        words = [w for segment in row["segments"] for w in segment["words"]]
        assert [[round(w["start"] * 1000), round(w["end"] * 1000)] for w in words] == spans
        # each word is its own characters, capitals and the marks after them aside
        assert [w["word"].strip(" ,.?，。？、").lower() for w in words] == text.lower().split(" ")
        assert "".join(w["word"] for w in words).replace(" ", "") == row["text"].replace(" ", "")


def test_text_format_prints_the_punctuated_text(capsys) -> None:
    first = clip_paths()[0]
    assert main(["transcribe", first, "--model", str(PARAFORMER), "--device", "cpu", "--quiet",
                 "--punctuate", str(PUNC)]) == 0
    assert capsys.readouterr().out.strip() == golden()["paraformer"]["texts"][0].strip()


def test_api_punctuate_equals_the_cli() -> None:
    import oasr

    results = oasr.transcribe(clip_paths(), model=str(PARAFORMER), device="cpu", punctuate=PUNC)
    assert [r.text for r in results] == [text.strip() for text in golden()["paraformer"]["texts"]]


def test_a_model_that_punctuates_is_refused_naming_the_option(capsys) -> None:
    code = main(["transcribe", clip_paths()[0], "--model", str(DATA / "sense_voice"), "--device", "cpu", "--quiet",
                 "--punctuate", str(PUNC)])
    assert code != 0
    err = capsys.readouterr().err
    assert "oasr: error:" in err and "writes its own punctuation: --punctuate" in err and "Traceback" not in err
    assert "or with --no-punctuation" in err


def test_sense_voice_without_its_itn_takes_the_punctuator(capsys) -> None:
    from oasr.transcription.punctuation import load_punctuator

    common = ["transcribe", clip_paths()[0], "--model", str(DATA / "sense_voice"), "--device", "cpu", "--quiet",
              "--no-punctuation"]
    assert main(common) == 0
    plain = capsys.readouterr().out.strip()
    assert main([*common, "--punctuate", str(PUNC)]) == 0
    [written] = load_punctuator(PUNC).punctuate([plain])
    assert len(plain) >= 5 and capsys.readouterr().out.strip() == written.text.strip() != plain


def test_a_missing_or_wrong_folder_is_a_clear_error(capsys, tmp_path) -> None:
    for folder, message in ((tmp_path / "nope", "does not exist"), (PARAFORMER, "field model is 'Paraformer'")):
        code = main(["transcribe", clip_paths()[0], "--model", str(PARAFORMER), "--device", "cpu", "--quiet",
                     "--punctuate", str(folder)])
        err = capsys.readouterr().err
        assert code != 0 and message in err and "Traceback" not in err, err


def test_streamed_transcripts_are_punctuated_at_the_end(capsys) -> None:
    from oasr.transcription.punctuation import load_punctuator

    first = clip_paths()[0]
    streaming = str(DATA / "paraformer_streaming")
    common = ["transcribe", first, "--model", streaming, "--device", "cpu", "--quiet", "--stream"]
    assert main(common) == 0
    plain = capsys.readouterr().out.strip()
    assert main([*common, "--punctuate", str(PUNC)]) == 0
    punctuated = capsys.readouterr().out.strip()
    [written] = load_punctuator(PUNC).punctuate([plain])
    assert len(plain) >= 10 and punctuated == written.text.strip() != plain
