"""OASR's native format: ``oasr.json`` (architecture + config) beside ``model.safetensors`` and ``tokenizer.json``.

Weights are stored in the architecture's own key layout, untied (safetensors keeps one copy per tensor name),
in the dtype they were converted with. Version 2 adds ``"quantization"`` to ``oasr.json``: a
``QuantizationSpec`` whose modules' weights are stored quantized beside float32 ``weight_scale`` tensors (never
cast on writing). Quantized checkpoints are written as version 2 and others as version 1, so a reader that
predates quantization refuses a quantized checkpoint instead of loading its int8 bytes as numbers.
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
from oasr.quantization.spec import QuantizationSpec

FORMAT_VERSION = 1
QUANTIZED_FORMAT_VERSION = 2
MANIFEST = "oasr.json"
# The file a tokenizer other than the architecture's own is stored as (named in oasr.json "tokenizer").
_TOKENIZER_FILES = {"sentencepiece": "tokenizer.model"}


@CONVERTERS.register("native")
class NativeConverter:
    @staticmethod
    def detect(source: ModelSource) -> bool:
        return (source.directory / MANIFEST).is_file()

    @staticmethod
    def load(source: ModelSource) -> Checkpoint:
        manifest = json.loads(require_file(source.directory / MANIFEST).read_text())
        version = manifest.get("format_version")
        if version not in (FORMAT_VERSION, QUANTIZED_FORMAT_VERSION):
            raise CheckpointError(f"{source}: {MANIFEST} format_version {version!r} is not "
                                  f"{FORMAT_VERSION} or {QUANTIZED_FORMAT_VERSION}")
        return Checkpoint(
            architecture=manifest["architecture"],
            config=manifest["config"],
            state_dict=load_state_dict([require_file(source.directory / "model.safetensors")]),
            tokenizer_file=require_file(source.directory / _TOKENIZER_FILES.get(manifest.get("tokenizer"), "tokenizer.json")),
            format="native",
            tokenizer=manifest.get("tokenizer"),
            quantization=_read_spec(source, manifest.get("quantization")),
        )


def _read_spec(source: ModelSource, values) -> QuantizationSpec | None:
    if values is None:
        return None
    try:
        return QuantizationSpec.from_dict(values)
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{source}: {MANIFEST} has an invalid quantization spec: {exc}") from None


def save_native(checkpoint: Checkpoint, destination: Path, *, dtype: torch.dtype | None = None) -> Path:
    """Writes ``checkpoint`` to ``destination`` in the native format; returns the directory."""
    destination.mkdir(parents=True, exist_ok=True)
    spec = checkpoint.quantization
    as_is = spec.stored_keys() if spec is not None else set()
    tensors = {
        k: (v.to(dtype) if dtype is not None and v.is_floating_point() and k not in as_is else v).contiguous()
        for k, v in checkpoint.state_dict.items()
    }
    save_file(tensors, str(destination / "model.safetensors"))
    manifest = {"format_version": FORMAT_VERSION if spec is None else QUANTIZED_FORMAT_VERSION,
                "architecture": checkpoint.architecture, "config": checkpoint.config}
    if spec is not None:
        manifest["quantization"] = spec.to_dict()
    if checkpoint.tokenizer is not None:
        manifest["tokenizer"] = checkpoint.tokenizer
    (destination / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    shutil.copyfile(checkpoint.tokenizer_file, destination / _TOKENIZER_FILES.get(checkpoint.tokenizer, "tokenizer.json"))
    return destination
