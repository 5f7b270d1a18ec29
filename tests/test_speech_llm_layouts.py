"""The speech LLMs' checkpoints come in more than one key layout: the released one (``language_model.model.*``,
which transformers 5.25 restores on save), transformers' in-memory one (``model.language_model.*``, ``model.<tower>``
and a top-level ``lm_head``: what 5.25 writes with ``save_original_format=False``), the one transformers 5.17
wrote on the H200 (``language_model.model.model.*`` beside ``language_model.lm_head``: one ``model.`` too deep), and
one with the language model's layers straight under ``language_model.`` beside a top-level ``lm_head``. Each loads
to the same weights as the released layout."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

import granite_speech_reference
import oasr
import qwen2_audio_reference
import voxtral_reference

FAMILIES = {
    "voxtral": (voxtral_reference, transformers.VoxtralForConditionalGeneration),
    "qwen2_audio": (qwen2_audio_reference, transformers.Qwen2AudioForConditionalGeneration),
    "granite_speech": (granite_speech_reference, transformers.GraniteSpeechForConditionalGeneration),
}


def weights(directory: Path) -> dict[str, torch.Tensor]:
    return oasr.from_pretrained(directory, device="cpu", dtype="float32").model.state_dict()


def copy_without_weights(source: Path, target: Path) -> Path:
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("*.safetensors", "*.safetensors.index.json"))
    return target


def in_memory_layout(source: Path, target: Path, model_class) -> Path:
    """The checkpoint as transformers writes it without restoring the original key names."""
    model = model_class.from_pretrained(source)
    model.save_pretrained(copy_without_weights(source, target), save_original_format=False)
    return target


def layout_of_5_17(source: Path, target: Path) -> Path:
    """The released layout with the language model one ``model.`` level deeper, as 5.17 saved Voxtral on the H200."""
    state = load_file(source / "model.safetensors")
    renamed = {key.replace("language_model.model.", "language_model.model.model.", 1): tensor
               for key, tensor in state.items()}
    save_file(renamed, copy_without_weights(source, target) / "model.safetensors", metadata={"format": "pt"})
    return target


def flat_layout(source: Path, target: Path) -> Path:
    """The released layout with the language model's ``model.`` level dropped and its head at the top."""
    state = load_file(source / "model.safetensors")
    renamed = {}
    for key, tensor in state.items():
        if key.startswith("language_model.model."):
            key = "language_model." + key.removeprefix("language_model.model.")
        elif key.startswith("language_model.lm_head."):
            key = key.removeprefix("language_model.")
        renamed[key] = tensor
    save_file(renamed, copy_without_weights(source, target) / "model.safetensors", metadata={"format": "pt"})
    return target


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_layout_loads_the_same_weights(family: str, tmp_path: Path) -> None:
    reference, model_class = FAMILIES[family]
    released = reference.make_checkpoint(tmp_path / "released")
    in_memory = in_memory_layout(released, tmp_path / "in_memory", model_class)
    # the rewritten files really are in other layouts (else this test would compare a layout with itself)
    assert any(k.startswith("model.language_model.") for k in load_file(in_memory / "model.safetensors"))
    old = layout_of_5_17(released, tmp_path / "old")
    assert any(k.startswith("language_model.model.model.") for k in load_file(old / "model.safetensors"))
    flat = flat_layout(released, tmp_path / "flat")
    assert any(k.startswith("language_model.layers.") for k in load_file(flat / "model.safetensors"))
    expected = weights(released)
    for directory in (in_memory, old, flat):
        got = weights(directory)
        assert got.keys() == expected.keys()
        for key, tensor in expected.items():
            assert torch.equal(got[key], tensor), (directory.name, key)
