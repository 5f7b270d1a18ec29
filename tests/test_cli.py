"""``oasr`` on the command line: output formats, per-file errors, models, convert."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import oasr
from oasr.cli import main

JFK = Path(oasr.__file__).parent / "assets" / "jfk.flac"


def test_jsonl_has_one_object_per_input_with_the_promised_fields(capsys) -> None:
    assert main(["transcribe", str(JFK), str(JFK), "--device", "cpu", "--output-format", "jsonl"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2
    row = json.loads(lines[0])
    assert {"file", "text", "language", "duration_s", "token_ids"} <= row.keys()
    assert row["file"] == str(JFK) and row["language"] == "en" and row["duration_s"] == 11.0
    assert row["text"].startswith("And so my fellow Americans")
    assert row["token_ids"][:3] == [843, 523, 616]


def test_a_bad_file_is_named_and_the_others_still_transcribed(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "broken.wav"
    bad.write_text("not audio")
    code = main(["transcribe", str(bad), str(JFK), "--device", "cpu", "--output-format", "jsonl", "--quiet"])
    captured = capsys.readouterr()
    assert code == 1
    errors = [line for line in captured.err.splitlines() if line.startswith("oasr: error:")]
    assert len(errors) == 1 and str(bad) in errors[0]
    assert [json.loads(line)["file"] for line in captured.out.strip().splitlines()] == [str(JFK)]


@pytest.mark.parametrize("fmt", ["txt", "json", "jsonl", "srt", "vtt"])
def test_output_dir_gets_one_file_per_input(tmp_path: Path, fmt: str) -> None:
    assert main(["transcribe", str(JFK), "--device", "cpu", "--output-format", fmt, "--output-dir", str(tmp_path)]) == 0
    text = (tmp_path / f"jfk.{fmt}").read_text(encoding="utf-8")
    assert "fellow Americans" in text
    # Subtitles carry the timestamp tokens' segments (tiny.en closes the first one at 8.00 s).
    if fmt == "srt":
        assert text.startswith("1\n00:00:00,000 --> 00:00:08,000\nAnd so my fellow Americans")
        assert "\n2\n00:00:08,000 --> 00:00:11,000\nask what you can do for your country.\n" in text
    if fmt == "vtt":
        assert text.startswith("WEBVTT\n\n00:00:00.000 --> 00:00:08.000\n")
    if fmt == "json":
        assert json.loads(text)["duration_s"] == 11.0


def test_sequential_long_form_prints_timestamped_segments_and_refuses_what_the_model_cannot_do(capsys) -> None:
    args = ["transcribe", str(JFK), "--device", "cpu", "--long-form", "sequential", "--no-fallback"]
    assert main([*args, "--output-format", "json"]) == 0
    row = json.loads(capsys.readouterr().out)[0]
    first, second = row["segments"]  # openai-whisper's transcribe() gives (0.00, 7.74) and (7.74, 10.74)
    assert (first["start"], first["end"], second["start"], second["end"]) == (0.0, 7.74, 7.74, 10.74)
    assert row["text"] == " ".join(s["text"] for s in row["segments"])
    assert main([*args, "--task", "translate"]) == 2
    assert "cannot translate" in capsys.readouterr().err
    assert main([*args, "--language", "de"]) == 2
    assert "English-only" in capsys.readouterr().err


def test_unknown_model_is_a_one_line_error(capsys) -> None:
    assert main(["transcribe", str(JFK), "--model", "nonexistent-model"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("oasr: error:") and "nonexistent-model" in err and "\n" not in err


def test_models_lists_architectures_installed_names_and_kernel_gaps(capsys) -> None:
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "whisper" in out
    assert "tiny.en" in out and "base" in out and "[installed]" in out
    assert "kernel gaps" in out and "attention" in out
    assert "conformer_conv" in out  # a kernel the backend has


def test_convert_then_transcribe_from_the_native_directory(tmp_path: Path, capsys) -> None:
    assert main(["convert", "tiny.en", str(tmp_path / "m")]) == 0
    assert {"oasr.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in (tmp_path / "m").iterdir()}
    capsys.readouterr()
    for model in ("tiny.en", str(tmp_path / "m")):
        assert main(["transcribe", str(JFK), "--model", model, "--device", "cpu", "--output-format", "jsonl"]) == 0
    embedded, native = (json.loads(line) for line in capsys.readouterr().out.strip().splitlines())
    assert native["token_ids"] == embedded["token_ids"]


def test_console_script_is_installed() -> None:
    out = subprocess.run([sys.executable, "-m", "oasr.cli", "--help"], capture_output=True, text=True, check=True)
    assert "transcribe" in out.stdout and "convert" in out.stdout
