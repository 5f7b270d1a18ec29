"""transformers' ``save_pretrained`` layout of a diarization checkpoint -> the architecture, its config and its
state dict. The modules mirror transformers' keys, so no key is renamed; the processor's streaming modes
(``processor_config.json``) join the config, and the feature settings (``preprocessor_config.json``) are
checked against the frontend the family runs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from oasr.errors import CheckpointError
from oasr.models.converters.safetensors_io import find_weights, load_state_dict

# transformers' model_type -> the DIARIZATION_ARCHITECTURES entry that serves it.
MODEL_TYPES = {"nemotron3_diarization": "nemotron3_diarization"}
# The frontend the family runs (``nemotron_logmel``); a checkpoint asking for other settings is refused.
_FEATURE_SETTINGS = {"sampling_rate": 16000, "hop_length": 160, "n_fft": 512, "win_length": 400, "preemphasis": 0.97}


@dataclass
class DiarizationCheckpoint:
    architecture: str
    config: dict[str, Any]
    state_dict: dict[str, torch.Tensor]


def is_diarization_checkpoint(directory: Path) -> bool:
    """A directory whose ``config.json`` names a diarization model type (cheap: one small JSON)."""
    config = directory / "config.json"
    try:
        return config.is_file() and json.loads(config.read_text()).get("model_type") in MODEL_TYPES
    except (json.JSONDecodeError, OSError):
        return False


def read_checkpoint(directory: Path) -> DiarizationCheckpoint:
    config_file = directory / "config.json"
    if not config_file.is_file():
        raise CheckpointError(f"{directory}: no config.json")
    config = json.loads(config_file.read_text())
    model_type = config.get("model_type")
    if model_type not in MODEL_TYPES:
        raise CheckpointError(f"{directory}: model_type {model_type!r} is not a diarization model; known: "
                              f"{', '.join(MODEL_TYPES)}")
    processor_file = directory / "processor_config.json"
    if processor_file.is_file():
        processor = json.loads(processor_file.read_text())
        if processor.get("streaming_modes"):
            config["streaming_modes"] = processor["streaming_modes"]
        if processor.get("streaming_mode"):
            config["default_streaming_mode"] = processor["streaming_mode"]
        _check_features(directory, processor.get("feature_extractor") or {})
    preprocessor_file = directory / "preprocessor_config.json"
    if preprocessor_file.is_file():
        _check_features(directory, json.loads(preprocessor_file.read_text()))
    weights = find_weights(directory)
    if not weights:
        raise CheckpointError(f"{directory}: no weights (model.safetensors, its index, or pytorch_model.bin)")
    return DiarizationCheckpoint(MODEL_TYPES[model_type], config, load_state_dict(weights))


def _check_features(directory: Path, settings: dict[str, Any]) -> None:
    for key, expected in _FEATURE_SETTINGS.items():
        if key in settings and settings[key] != expected:
            raise CheckpointError(f"{directory}: feature setting {key}={settings[key]!r} is not served "
                                  f"(the nemotron_logmel frontend uses {expected!r})")
