"""Reading state dicts stored as safetensors (single file or sharded with an index) or torch pickles."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from oasr.errors import CheckpointError


def find_weights(directory: Path) -> list[Path]:
    single = directory / "model.safetensors"
    if single.is_file():
        return [single]
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [directory / shard for shard in shards]
    pickle = directory / "pytorch_model.bin"
    if pickle.is_file():
        return [pickle]
    return []


def load_state_dict(files: list[Path]) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    for path in files:
        if not path.is_file():
            raise CheckpointError(f"weight file missing: {path}")
        if path.suffix == ".safetensors":
            state.update(load_file(str(path)))
        else:
            state.update(torch.load(path, map_location="cpu", weights_only=True))
    return state
