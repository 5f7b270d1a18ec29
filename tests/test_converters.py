"""Checkpoint formats: CTranslate2 -> native round trip, Hugging Face directories, and broken files."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import pytest
import torch
from transformers import WhisperForConditionalGeneration as HFWhisper

from oasr.bench.peer_transformers import hf_whisper_config
from oasr.cli import main
from oasr.errors import CheckpointError, ModelNotFoundError
from oasr.models import ARCHITECTURES
from oasr.models.checkpoint import ModelSource
from oasr.models.converters.ct2_format import read_ct2_model
from oasr.models.embedded import resolve_embedded
from oasr.models.loader import from_pretrained

PROMPT = [[50257, 50362, 843, 523, 616], [50257, 50362, 50256, 50256, 50256]]


def logits_of(loaded, seed: int = 0) -> torch.Tensor:
    features = torch.randn(2, loaded.config.num_mel_bins, 3000, generator=torch.Generator().manual_seed(seed))
    with torch.inference_mode():
        return loaded.model(features, torch.tensor(PROMPT))


def test_ctranslate2_to_native_round_trip_gives_identical_logits(tiny_en, tmp_path: Path) -> None:
    assert main(["convert", "tiny.en", str(tmp_path / "native")]) == 0
    native = from_pretrained(tmp_path / "native", device="cpu", dtype="float32")
    assert native.format == "native" and tiny_en.format == "ctranslate2"
    assert native.config == tiny_en.config
    assert torch.equal(logits_of(native), logits_of(tiny_en))


def test_split_ctranslate2_parts_equal_the_joined_file(tmp_path: Path) -> None:
    source = resolve_embedded("base")
    joined = tmp_path / "base"
    joined.mkdir()
    for name in ("config.json", "tokenizer.json"):
        shutil.copy(source.directory / name, joined / name)
    with (joined / "model.bin").open("wb") as out:
        for part in source.weight_files:
            out.write(part.read_bytes())
    from_parts = read_ct2_model(list(source.weight_files))
    from_file = read_ct2_model([joined / "model.bin"])
    assert from_parts.variables.keys() == from_file.variables.keys()
    assert all((from_parts.variables[k] == from_file.variables[k]).all() for k in from_file.variables)


def test_huggingface_directory_loads_with_identical_logits(tiny_en, tmp_path: Path) -> None:
    arch = ARCHITECTURES.get("whisper")
    tiny = arch.tiny_config()
    hf_config = hf_whisper_config(tiny)
    torch.manual_seed(0)
    reference = HFWhisper(hf_config).eval()
    reference.save_pretrained(tmp_path)
    shutil.copy(tiny_en.tokenizer.path, tmp_path / "tokenizer.json")
    loaded = from_pretrained(tmp_path, device="cpu", dtype="float32")
    assert loaded.format == "huggingface"
    features = torch.randn(2, 80, 3000)
    ids = torch.tensor(PROMPT)
    with torch.inference_mode():
        ours = loaded.model(features, ids)
        theirs = reference(input_features=features, decoder_input_ids=ids).logits
    assert (ours - theirs).abs().max().item() < 1e-4


def test_truncated_ctranslate2_file_is_a_checkpoint_error(tmp_path: Path) -> None:
    source = resolve_embedded("tiny.en")
    cut = tmp_path / "model.bin"
    cut.write_bytes(source.weight_files[0].read_bytes()[:100_000])
    with pytest.raises(CheckpointError, match="truncated"):
        read_ct2_model([cut])


def test_unsupported_ctranslate2_version_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "model.bin"
    bad.write_bytes(struct.pack("<I", 3) + b"\0" * 64)
    with pytest.raises(CheckpointError, match="version 3"):
        read_ct2_model([bad])


def test_directory_without_a_checkpoint_is_refused(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("nothing here")
    with pytest.raises(ModelNotFoundError, match="no supported checkpoint format"):
        from_pretrained(tmp_path, device="cpu")


def test_missing_weights_fail_loudly(tiny_en, tmp_path: Path) -> None:
    assert main(["convert", "tiny.en", str(tmp_path)]) == 0
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(tmp_path / "model.safetensors"))
    del tensors["model.decoder.layers.1.fc2.weight"]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="fc2.weight"):
        from_pretrained(tmp_path, device="cpu")


def test_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(ModelNotFoundError, match="tiny.en"):
        from_pretrained("large-v9", device="cpu")


def test_embedded_model_source_points_at_installed_packages() -> None:
    source = resolve_embedded("base")
    assert isinstance(source, ModelSource)
    assert [p.name for p in source.weight_files] == ["model.bin.part1", "model.bin.part2"]
    assert (source.directory / "tokenizer.json").is_file()
