"""OASR's native format: ``oasr.json`` (architecture + config) beside ``model.safetensors`` and ``tokenizer.json``.

Weights are stored in the architecture's own key layout, untied (safetensors keeps one copy per tensor name),
in the dtype they were converted with.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from oasr.errors import CheckpointError
from oasr.models import CONVERTERS
from oasr.models.checkpoint import Checkpoint, ModelSource, require_file
from oasr.models.converters.safetensors_io import load_state_dict

FORMAT_VERSION = 1
MANIFEST = "oasr.json"


@CONVERTERS.register("native")
class NativeConverter:
    @staticmethod
    def detect(source: ModelSource) -> bool:
        return (source.directory / MANIFEST).is_file()

    @staticmethod
    def load(source: ModelSource) -> Checkpoint:
        manifest = json.loads(require_file(source.directory / MANIFEST).read_text())
        if manifest.get("format_version") != FORMAT_VERSION:
            raise CheckpointError(f"{source}: {MANIFEST} format_version {manifest.get('format_version')!r} is not {FORMAT_VERSION}")
        return Checkpoint(
            architecture=manifest["architecture"],
            config=manifest["config"],
            state_dict=load_state_dict([require_file(source.directory / "model.safetensors")]),
            tokenizer_file=require_file(source.directory / "tokenizer.json"),
            format="native",
        )


def save_native(checkpoint: Checkpoint, destination: Path, *, dtype: torch.dtype | None = None) -> Path:
    """Writes ``checkpoint`` to ``destination`` in the native format; returns the directory."""
    destination.mkdir(parents=True, exist_ok=True)
    tensors = {
        k: (v.to(dtype) if dtype is not None and v.is_floating_point() else v).contiguous()
        for k, v in checkpoint.state_dict.items()
    }
    save_file(tensors, str(destination / "model.safetensors"))
    manifest = {"format_version": FORMAT_VERSION, "architecture": checkpoint.architecture, "config": checkpoint.config}
    (destination / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    shutil.copyfile(checkpoint.tokenizer_file, destination / "tokenizer.json")
    return destination
