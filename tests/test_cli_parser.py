"""``oasr``'s parser: -v on either side of the command, --version, defaults in every help, --device cuda:N."""

from __future__ import annotations

import re

import pytest
import torch

import oasr
from oasr.cli import build_parser, main
from oasr.errors import ModelNotFoundError
from oasr.models.loader import check_device

JFK = oasr.__file__.replace("__init__.py", "assets/jfk.flac")


@pytest.mark.parametrize("argv, verbose", [(["serve"], False), (["-v", "serve"], True), (["serve", "-v"], True),
                                           (["transcribe", "x.wav", "--verbose"], True), (["models", "-v"], True)])
def test_verbose_is_accepted_before_or_after_the_command(argv: list[str], verbose: bool) -> None:
    assert build_parser().parse_args(argv).verbose is verbose


def test_version_prints_the_package_version(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"oasr {oasr.__version__}"


def _help(command: str) -> str:
    subcommands = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    return " ".join(subcommands[command].format_help().split())  # argparse wraps lines: join them back


def test_every_command_help_shows_its_defaults_and_no_empty_ones() -> None:
    serve = _help("serve")
    for shown in ("--port PORT port to listen on (default: 8000)", "(default: 127.0.0.1)", "(default: tiny.en)",
                  "(default: 256)", "--log-format {text,json}"):
        assert shown in serve
    assert re.search(r"--output-format \{txt,json,jsonl,srt,vtt,diarized_json\} [^{]*\(default: txt\) --output-dir",
                     _help("transcribe"))
    assert "(default: 0.5)" in _help("quantize")
    for command in ("transcribe", "serve", "models", "convert", "quantize", "bench"):
        text = _help(command)
        assert not re.search(r"default: (None|False)\)", text), command
        assert "-v, --verbose" in text


@pytest.mark.parametrize("command", [["transcribe", "a.wav"], ["serve"], ["bench"]])
def test_device_takes_a_gpu_index_in_every_command(command: list[str]) -> None:
    assert build_parser().parse_args([*command, "--device", "cuda:1"]).device == "cuda:1"
    with pytest.raises(SystemExit):
        build_parser().parse_args([*command, "--device", "gpu1"])


def test_a_gpu_index_the_machine_lacks_is_named_with_what_it_has(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert check_device("cuda:1") == torch.device("cuda", 1)
    with pytest.raises(ModelNotFoundError, match=r"'cuda:2' .* has 2 CUDA devices \(cuda:0 to cuda:1\)"):
        check_device("cuda:2")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error of a machine without a GPU")
@pytest.mark.parametrize("command", [["transcribe", JFK], ["serve", "--port", "1"]])
def test_cuda_n_without_a_gpu_is_a_one_line_error(command: list[str], capsys) -> None:
    assert main([*command, "--device", "cuda:1"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "oasr: error: device 'cuda:1' was asked for but no CUDA device is available"
