"""Nemotron 3 Diarization against transformers on a tiny random checkpoint written by ``save_pretrained``:
frame probabilities within 1e-4 of transformers' offline forward and the same segments as its processor's
``extract_speaker_dict``, on two- and three-speaker mixtures of the shared clips, batched together."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from nemotron3_diarization_reference import build_reference, mixture, offline_logits, processor, save_reference
from oasr.diarization.loader import load_diarizer
from oasr.diarization.offline import OfflineDiarizer
from oasr.diarization.segments import speaker_segments
from oasr.errors import CheckpointError, ModelNotFoundError
from oasr.models import DIARIZATION_ARCHITECTURES


@pytest.fixture(scope="module")
def mixtures() -> dict[str, np.ndarray]:
    two, three = mixture(2), mixture(3)
    # 2.05 s: 205 mel frames, whose last encoder frame is part padding; a cut that ends on a whole encoder frame
    return {"two": two, "three": three, "short": two[:32_800], "whole": two[: 16_000 * 2 + 8 * 160]}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, mixtures):
    reference = build_reference([mixtures["two"], mixtures["three"]])
    return reference, save_reference(reference, tmp_path_factory.mktemp("diarization"))


@pytest.fixture(scope="module")
def expected(checkpoint, mixtures) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """transformers' offline logits and attention mask of each mixture, run alone."""
    return {name: offline_logits(checkpoint[0], audio) for name, audio in mixtures.items()}


@pytest.fixture(scope="module")
def diarizer(checkpoint) -> OfflineDiarizer:
    return OfflineDiarizer(load_diarizer(checkpoint[1], device="cpu"))


@pytest.mark.parametrize("name", DIARIZATION_ARCHITECTURES.names())
def test_every_diarization_architecture_runs_its_tiny_config_from_the_layer_waist(name):
    arch = DIARIZATION_ARCHITECTURES.get(name)
    config = arch.tiny_config()
    model = arch.from_config(config).eval()
    features, lengths = arch.example_inputs(config, 2)
    logits = model(features, lengths)
    assert logits.shape == (2, features.shape[1], config.num_speakers) and torch.isfinite(logits).all()
    foreign = [path for path, module in model.named_modules()
               if not type(module).__module__.startswith(("oasr.layers", "oasr.models", "torch.nn.modules.container"))]
    assert foreign == []


def test_offline_probabilities_match_transformers_in_one_batch(diarizer, mixtures, expected):
    names = list(mixtures)
    got = diarizer.probabilities([mixtures[n] for n in names])
    for name, probs in zip(names, got):
        logits, mask = expected[name]
        want = logits[0, : int(mask.sum())].sigmoid().numpy()
        assert probs.shape == want.shape, name
        assert np.abs(probs - want).max() < 1e-4, name
        # the test is only worth something if speakers come and go
        assert 0.1 < (want > 0.5).mean() < 0.9, name


def test_segments_equal_extract_speaker_dict(diarizer, mixtures, expected):
    results = diarizer.diarize([mixtures["two"], mixtures["three"]], ["two", "three"])
    for result in results:
        want = processor(16).extract_speaker_dict(*expected[result.source], threshold=0.5)[0]
        got = [{"Start": s.start, "End": s.end, "Speaker": s.speaker} for s in result.segments]
        assert got == want
        assert {s["Speaker"] for s in want} == {0, 1, 2, 3}


def test_speaker_segments_bounds_and_order():
    probs = np.zeros((10, 2), dtype=np.float32)
    probs[2:5, 1] = 0.9
    probs[3:10, 0] = 0.7
    probs[6, 0] = 0.5  # not over the threshold
    got = [(s.start, s.end, s.speaker) for s in speaker_segments(probs, 0.01)]
    assert got == [(0.02, 0.05, 1), (0.03, 0.06, 0), (0.07, 0.1, 0)]


def test_a_checkpoint_missing_a_key_is_refused(checkpoint, tmp_path):
    from safetensors.torch import load_file, save_file

    _, directory = checkpoint
    for path in directory.glob("*.json"):
        (tmp_path / path.name).write_bytes(path.read_bytes())
    state = load_file(str(directory / "model.safetensors"))
    state.pop("classifier.out_proj.weight")
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="classifier.out_proj.weight"):
        load_diarizer(tmp_path, device="cpu")


def test_a_directory_that_is_no_diarization_model_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "whisper"}))
    with pytest.raises(ModelNotFoundError, match="not a diarization checkpoint"):
        load_diarizer(tmp_path, device="cpu")
    with pytest.raises(ModelNotFoundError, match="neither"):
        load_diarizer(tmp_path / "absent", device="cpu")
