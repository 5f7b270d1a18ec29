"""``oasr transcribe`` with several inputs and no --output-dir: stdout says which text is whose, and formats
that are one document per input are refused rather than glued into one invalid file."""

from __future__ import annotations

from pathlib import Path

import pytest

import oasr
from oasr.cli import main

JFK = Path(oasr.__file__).parent / "assets" / "jfk.flac"


def test_txt_of_several_inputs_starts_each_line_with_its_file(tmp_path: Path, capsys) -> None:
    other = tmp_path / "again.flac"
    other.write_bytes(JFK.read_bytes())
    assert main(["transcribe", str(JFK), str(other), "--device", "cpu", "--quiet"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(": ", 1)[0] for line in lines] == [str(JFK), str(other)]
    assert all(line.split(": ", 1)[1].startswith("And so my fellow Americans") for line in lines)


def test_txt_of_one_input_is_its_text_alone(capsys) -> None:
    assert main(["transcribe", str(JFK), "--device", "cpu", "--quiet"]) == 0
    assert capsys.readouterr().out.startswith("And so my fellow Americans")


@pytest.mark.parametrize("fmt", ["srt", "vtt"])
def test_subtitles_of_several_inputs_on_stdout_are_refused_before_any_model_loads(fmt: str, capsys) -> None:
    assert main(["transcribe", str(JFK), str(JFK), "--model", "no-such-model", "--output-format", fmt]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"oasr: error: --output-format {fmt} makes one document per input")
    assert "--output-dir" in captured.err and len(captured.err.splitlines()) == 1
