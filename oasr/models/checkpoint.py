"""What converters hand the loader: a checkpoint in an architecture's own key layout."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from oasr.quantization.spec import QuantizationSpec


@dataclass(frozen=True)
class ModelSource:
    """Where a checkpoint lives: a directory, and optionally weight files kept elsewhere (split packages), or a
    single-file archive (a NeMo ``.nemo``; ``directory`` is then the folder holding it)."""

    directory: Path
    weight_files: tuple[Path, ...] = ()
    name: str | None = None
    archive: Path | None = None

    def __str__(self) -> str:
        return self.name or str(self.archive or self.directory)


@dataclass
class Checkpoint:
    architecture: str
    config: dict[str, Any]
    state_dict: dict[str, torch.Tensor]
    tokenizer_file: Path
    format: str
    # Keys of the source that no module takes (kept for the load report).
    dropped_keys: list[str] = field(default_factory=list)
    # How the state dict's GEMMs are quantized (a native checkpoint written by ``oasr quantize``), or None.
    quantization: QuantizationSpec | None = None
    # The TOKENIZERS entry that reads ``tokenizer_file`` when it is not the architecture's own (a NeMo archive's
    # SentencePiece model), or None.
    tokenizer: str | None = None


class CheckpointConverter(Protocol):
    """Reads one on-disk format. ``detect`` must be cheap (file names, a small JSON)."""

    @staticmethod
    def detect(source: ModelSource) -> bool: ...

    @staticmethod
    def load(source: ModelSource) -> Checkpoint: ...


def require_file(path: Path) -> Path:
    from oasr.errors import CheckpointError

    if not path.is_file():
        raise CheckpointError(f"checkpoint file missing: {path}")
    return path
