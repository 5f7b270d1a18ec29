"""A diarization model by directory or Hub id -> a ``LoadedDiarizer`` (model, frontend, device, dtype).

Diarization checkpoints carry no tokenizer and serve no decode strategy, so they load here rather than through
``oasr.models.loader``: the same source resolution for local paths, the same layer waist and device choice.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from oasr.errors import CheckpointError, HubUnavailableError, ModelNotFoundError
from oasr.features.nemo_logmel import NemoLogMelConfig, NemotronLogMel
from oasr.layers import apply_backend
from oasr.models import DIARIZATION_ARCHITECTURES
from oasr.models.hub import parse_hub_id
from oasr.models.loader import pick_device, pick_dtype

log = logging.getLogger(__name__)

# What a Hub snapshot of a diarization checkpoint needs.
_HUB_FILES = ("config.json", "model.safetensors", "model.safetensors.index.json", "model-*.safetensors",
              "pytorch_model.bin", "preprocessor_config.json", "processor_config.json")


@dataclass
class LoadedDiarizer:
    """Everything needed to run one diarization checkpoint. Built once, read-only afterwards."""

    name: str
    architecture: str
    config: Any
    model: nn.Module
    features: NemotronLogMel
    device: torch.device
    dtype: torch.dtype

    @property
    def frame_seconds(self) -> float:
        """Time of one output frame (one mel frame)."""
        c = self.features.config
        return c.hop_length / c.sample_rate


def resolve_directory(name_or_path: str | Path) -> Path:
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path.resolve()
    ref = parse_hub_id(str(name_or_path)) if isinstance(name_or_path, str) else None
    if ref is None:
        raise ModelNotFoundError(f"{name_or_path!r} is neither a diarization model directory nor a Hugging Face Hub "
                                 "id (ORG/NAME or ORG/NAME@REVISION)")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(ref.repo_id, revision=ref.revision, allow_patterns=list(_HUB_FILES)))
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError) as e:
        raise HubUnavailableError(f"{ref}: the diarization model could not be fetched ({e})") from None


def load_diarizer(name_or_path: str | Path, *, device: str | torch.device = "auto",
                  dtype: str | torch.dtype | None = None) -> LoadedDiarizer:
    directory = resolve_directory(name_or_path)
    family = next((DIARIZATION_ARCHITECTURES.get(name) for name in DIARIZATION_ARCHITECTURES.names()
                   if DIARIZATION_ARCHITECTURES.get(name).recognizes(directory)), None)
    if family is None:  # each family reads its own checkpoints: no family module is named outside models/
        raise ModelNotFoundError(f"{name_or_path}: not a diarization checkpoint (its config.json names no "
                                 f"diarization model_type; served: {', '.join(DIARIZATION_ARCHITECTURES.names())})")
    checkpoint = family.read_checkpoint(directory)
    arch = DIARIZATION_ARCHITECTURES.get(checkpoint.architecture)
    try:
        config = arch.config_class.from_dict(checkpoint.config)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{directory}: invalid config: {e}") from None
    model = arch.from_config(config)
    result = model.load_state_dict(checkpoint.state_dict, strict=False)
    if result.missing_keys:
        raise CheckpointError(f"{directory}: checkpoint is missing {len(result.missing_keys)} key(s) of "
                              f"{checkpoint.architecture}: {result.missing_keys[:8]}")
    log.info("loaded %d tensors; dropped: %s", len(checkpoint.state_dict), result.unexpected_keys or "none")
    target_device = pick_device(device)
    target_dtype = pick_dtype(dtype, target_device)
    model = model.to(device=target_device, dtype=target_dtype).eval().requires_grad_(False)
    apply_backend(model, "kernels" if target_device.type == "cuda" else "torch")
    features = NemotronLogMel(NemoLogMelConfig(num_mel_bins=config.num_mel_bins, normalize=False))
    return LoadedDiarizer(str(name_or_path), checkpoint.architecture, config, model, features, target_device,
                          target_dtype)
