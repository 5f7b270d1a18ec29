"""``oasr`` on the command line: output formats, per-file errors, models, convert."""

from __future__ import annotations

import json
import os
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
    assert main(["models", "--kernels"]) == 0
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


def _jfk_slice(path: Path, start_s: float, end_s: float | None = None) -> Path:
    import soundfile as sf

    samples, rate = sf.read(JFK, dtype="float32")
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(path, samples[int(start_s * rate) : None if end_s is None else int(end_s * rate)], rate)
    return path


def test_output_names_keep_the_first_stem_and_number_the_rest_around_taken_names() -> None:
    from oasr.cli import output_names

    files = [Path("a/clip.flac"), Path("b/clip.wav"), Path("c/clip-1.wav"), Path("d/clip.mp3"), Path("e/x.wav")]
    assert output_names(files) == ["clip", "clip-2", "clip-1", "clip-3", "x"]


def test_output_dir_never_overwrites_an_input_sharing_a_stem(tmp_path: Path) -> None:
    both = tmp_path / "a" / "clip.flac"
    both.parent.mkdir()
    both.write_bytes(JFK.read_bytes())
    opening = _jfk_slice(tmp_path / "b" / "clip.wav", 0.0, 3.0)  # "And so my fellow Americans"
    closing = _jfk_slice(tmp_path / "c" / "clip-1.wav", 6.0)  # "... what you can do for your country."
    out = tmp_path / "out"
    assert main(["transcribe", str(both), str(opening), str(closing), "--device", "cpu", "--quiet",
                 "--output-dir", str(out)]) == 0
    texts = {p.name: p.read_text(encoding="utf-8") for p in out.iterdir()}
    assert sorted(texts) == ["clip-1.txt", "clip-2.txt", "clip.txt"]
    assert "fellow" in texts["clip.txt"] and "country" in texts["clip.txt"]
    assert "fellow" in texts["clip-2.txt"] and "country" not in texts["clip-2.txt"]
    assert "country" in texts["clip-1.txt"] and "fellow" not in texts["clip-1.txt"]


def _one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("oasr: error:"), err
    return lines[0]


def test_output_dir_that_is_a_file_is_a_one_line_error(tmp_path: Path, capsys) -> None:
    not_a_dir = tmp_path / "results"
    not_a_dir.write_text("keep me")
    assert main(["transcribe", str(JFK), "--device", "cpu", "--output-dir", str(not_a_dir)]) == 2
    assert "not a directory" in _one_error_line(capsys.readouterr().err)
    assert not_a_dir.read_text() == "keep me"


def test_convert_onto_an_existing_file_is_a_one_line_error(tmp_path: Path, capsys) -> None:
    existing = tmp_path / "model"
    existing.write_text("keep me")
    assert main(["convert", "tiny.en", str(existing)]) == 2
    assert str(existing) in _one_error_line(capsys.readouterr().err)
    assert existing.read_text() == "keep me"


def test_a_full_disk_fails_that_output_only_and_leaves_no_partial_file(tmp_path: Path, monkeypatch, capsys) -> None:
    import errno

    first = tmp_path / "in" / "first.flac"
    first.parent.mkdir()
    first.write_bytes(JFK.read_bytes())
    import oasr.transcribe_command as command

    replace = command.os.replace

    def full_for_first(source, target, *args, **kwargs):
        if "first" in Path(target).name:  # the partial file is written; a full disk fails it on the way
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return replace(source, target, *args, **kwargs)

    monkeypatch.setattr(command.os, "replace", full_for_first)
    out = tmp_path / "out"
    assert main(["transcribe", str(first), str(JFK), "--device", "cpu", "--quiet", "--output-dir", str(out)]) == 1
    line = _one_error_line(capsys.readouterr().err)
    assert str(out / "first.txt") in line and "No space left on device" in line
    assert [p.name for p in out.iterdir()] == ["jfk.txt"]
    assert "fellow Americans" in (out / "jfk.txt").read_text(encoding="utf-8")


def test_stdout_on_a_full_disk_is_a_one_line_error() -> None:
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "oasr.cli", "transcribe", str(JFK), "--device", "cpu"],
                              stdout=full, stderr=subprocess.PIPE, text=True, timeout=300)
    assert done.returncode == 1
    assert "cannot write to stdout: No space left on device" in _one_error_line(done.stderr)


class _RecordingBar:
    """Stands in for tqdm: records what the CLI tells its progress bar."""

    instances: list[_RecordingBar] = []

    def __init__(self, *args, total: float = 0, **kwargs) -> None:
        self.total, self.updates, self.totals_at_update = total, [], []
        _RecordingBar.instances.append(self)

    def update(self, n: float) -> None:
        self.updates.append(n)
        self.totals_at_update.append(self.total)

    def refresh(self) -> None:
        pass

    def write(self, text: str, file=None) -> None:
        print(text, file=file)

    def close(self) -> None:
        pass


@pytest.mark.parametrize("long_form", ["parallel", "sequential"])
def test_progress_moves_in_audio_seconds_within_one_long_file(tmp_path: Path, monkeypatch, long_form: str) -> None:
    import numpy as np
    import soundfile as sf
    import tqdm

    samples, rate = sf.read(JFK, dtype="float32")
    long_file = tmp_path / "long.wav"
    sf.write(long_file, np.concatenate([samples] * 3), rate)  # 33 s: more than one 30 s window
    monkeypatch.setattr(tqdm, "tqdm", _RecordingBar)
    _RecordingBar.instances.clear()
    assert main(["transcribe", str(long_file), "--device", "cpu", "--long-form", long_form, "--no-fallback",
                 "--output-dir", str(tmp_path / "out")]) == 0
    (bar,) = _RecordingBar.instances
    assert bar.total == pytest.approx(33.0)
    assert len([n for n in bar.updates if n > 0]) >= 2 and sum(bar.updates) == pytest.approx(33.0)
    assert bar.totals_at_update[0] == pytest.approx(33.0)  # the file's length was known before it finished


def test_convert_on_a_full_disk_is_a_one_line_error_and_leaves_no_half_checkpoint(tmp_path: Path, monkeypatch,
                                                                                 capsys) -> None:
    import errno

    from oasr.models.converters import native

    def full_disk(checkpoint, destination: Path, **kwargs) -> Path:
        destination.mkdir(parents=True)
        (destination / "model.safetensors").write_bytes(b"\0" * 1024)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(native, "save_native", full_disk)
    destination = tmp_path / "converted"
    assert main(["convert", "tiny.en", str(destination)]) == 1
    assert "No space left on device" in _one_error_line(capsys.readouterr().err)
    assert not destination.exists()


def test_serve_max_streams_gives_a_streaming_model_that_many_stream_slots(monkeypatch, capsys) -> None:
    import oasr.serving.app
    from oasr.streaming.types import StreamingConfig

    calls = []
    monkeypatch.setattr(oasr.serving.app, "serve", lambda model, settings, **kwargs: calls.append(kwargs))
    assert main(["serve", "--device", "cpu", "--max-streams", "256"]) == 0
    assert main(["serve", "--device", "cpu"]) == 0
    assert [c["streaming"] for c in calls] == [StreamingConfig(max_streams=256), None]  # None: the default 64
    assert main(["serve", "--device", "cpu", "--max-streams", "0"]) == 2
    assert "max_streams" in capsys.readouterr().err and len(calls) == 2
