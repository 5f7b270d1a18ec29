"""``from_pretrained``: a name or directory -> a ready model with its tokenizer and feature extractor."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from oasr.errors import CheckpointError, ModelNotFoundError
from oasr.features import FEATURE_EXTRACTORS, FeatureExtractor
from oasr.layers import Backend, KernelGap, apply_backend
from oasr.models import ARCHITECTURES, CONVERTERS
from oasr.models.catalogue import CATALOGUE
from oasr.models.checkpoint import Checkpoint, ModelSource
from oasr.models.embedded import EMBEDDED_MODELS, resolve_embedded
from oasr.models.hub import fetch, parse_hub_id
from oasr.tokenizers import TOKENIZERS

log = logging.getLogger(__name__)

# Formats are tried in this order: the first whose ``detect`` accepts the directory loads it.
_DETECTION_ORDER = ("nemo", "native", "huggingface", "ctranslate2", "funasr")


@dataclass
class LoadedModel:
    """Everything needed to run one checkpoint. Built once, read-only afterwards."""

    name: str
    architecture: str
    format: str
    config: Any
    model: nn.Module
    tokenizer: Any
    features: FeatureExtractor
    device: torch.device
    dtype: torch.dtype
    kernel_gaps: list[KernelGap]
    checkpoint: Checkpoint | None = None


def resolve_source(name_or_path: str | Path) -> ModelSource:
    """A local path first, then a catalogue alias, an embedded name, a hub id (``ORG/NAME[@REVISION]``, fetched into
    huggingface_hub's cache and loaded from there as a local path). Only a hub id or an alias downloads anything."""
    path = Path(name_or_path).expanduser()
    if path.is_file() and path.suffix == ".nemo":
        return ModelSource(directory=path.parent.resolve(), archive=path.resolve())
    if path.is_dir():
        from oasr.models.converters.nemo import find_archive

        archive = find_archive(path)  # a folder holding one .nemo (a hub snapshot) loads it
        return ModelSource(directory=path.resolve(), archive=archive.resolve() if archive else None)
    name = str(name_or_path)
    hub_ref = parse_hub_id(CATALOGUE[name].hub_id) if name in CATALOGUE else None
    if hub_ref is None and name in EMBEDDED_MODELS:
        return resolve_embedded(name)
    if hub_ref is None and isinstance(name_or_path, str):  # a Path object always means a local path
        hub_ref = parse_hub_id(name)
    if hub_ref is not None:
        return replace(resolve_source(fetch(hub_ref)), name=name)
    known = ", ".join([*EMBEDDED_MODELS, *CATALOGUE])
    raise ModelNotFoundError(f"{name_or_path!r} is neither a model directory nor a known model name ({known}) nor a "
                             "Hugging Face Hub id (ORG/NAME or ORG/NAME@REVISION); `oasr models` lists the names")


def read_checkpoint(source: ModelSource) -> Checkpoint:
    for fmt in _DETECTION_ORDER:
        converter = CONVERTERS.get(fmt)
        if converter.detect(source):
            return converter.load(source)
    raise ModelNotFoundError(f"{source}: no supported checkpoint format found (tried {', '.join(_DETECTION_ORDER)})")


def check_device(device: str | torch.device = "auto") -> torch.device:
    """``device`` resolved ("auto": CUDA when there is a GPU), or ``ModelNotFoundError`` naming what this machine
    has; touches no GPU (a front end checks its engine's device with it before starting the engine)."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    resolved = torch.device(device)
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ModelNotFoundError(f"device {str(device)!r} was asked for but no CUDA device is available")
    if resolved.type == "cuda" and resolved.index is not None:
        count = torch.cuda.device_count()
        if resolved.index >= count:
            raise ModelNotFoundError(f"device {str(device)!r} was asked for but this machine has {count} CUDA "
                                     f"device{'s' if count != 1 else ''} (cuda:0 to cuda:{count - 1})")
    return resolved


def pick_device(device: str | torch.device = "auto") -> torch.device:
    resolved = check_device(device)
    if resolved.type == "cuda" and resolved.index is not None:
        # Kernels, CUDA graphs and caches allocate on the current device: make it the one asked for.
        torch.cuda.set_device(resolved)
    return resolved


def pick_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    if dtype is None or dtype == "auto":
        return torch.float16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    names = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16,
             "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
    if dtype not in names:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {', '.join(names)}")
    return names[dtype]


def build_model(checkpoint: Checkpoint) -> tuple[Any, nn.Module]:
    """Instantiates the architecture and loads the weights; fails on any missing key."""
    arch = ARCHITECTURES.get(checkpoint.architecture)
    config = arch.config_class.from_dict(checkpoint.config)
    model = arch.from_config(config)
    if checkpoint.quantization is not None:
        from oasr.quantization.apply import prepare_quantized

        prepare_quantized(model, checkpoint.quantization)
    result = model.load_state_dict(checkpoint.state_dict, strict=False)
    tied = getattr(arch, "tied_keys", {})
    missing = [k for k in result.missing_keys if k not in tied]
    dropped = [k for k in result.unexpected_keys if k not in tied] + checkpoint.dropped_keys
    if missing:
        raise CheckpointError(f"checkpoint is missing {len(missing)} key(s) of {checkpoint.architecture}: {missing[:8]}")
    log.info("loaded %d tensors (%s); dropped: %s", len(checkpoint.state_dict), checkpoint.format, dropped or "none")
    return config, model


def from_pretrained(
    name_or_path: str | Path = "tiny.en",
    *,
    device: str | torch.device = "auto",
    dtype: str | torch.dtype | None = None,
    backend: Backend | None = None,
    keep_checkpoint: bool = False,
    quantization: str | None = None,
    calibration_feed: Callable[[Any, Sequence[Path]], None] | None = None,
) -> LoadedModel:
    """Loads a model by embedded name (``tiny.en``, ``base``) or from a directory in any supported format.
    ``backend``: the layer waist's (``oasr.layers.backend``); by default ``kernels`` on CUDA, ``torch`` elsewhere.
    A quantized checkpoint loads quantized as it is; ``quantization`` (``fp8``, ``int8``) quantizes a
    full-precision one here, as ``oasr quantize`` would with its default calibration (``oasr.quantization``),
    which ``calibration_feed`` transcribes (int8's smoothing needs it; ``oasr.from_pretrained`` passes the offline
    transcriber's, ``oasr.transcription.offline.calibration_feed``: the loader sits below the transcriber)."""
    source = resolve_source(name_or_path)
    checkpoint = read_checkpoint(source)
    config, model = build_model(checkpoint)
    target_device = pick_device(device)
    target_dtype = pick_dtype(dtype, target_device)
    method = quantization or (checkpoint.quantization.method if checkpoint.quantization is not None else None)
    if method is not None:  # refused before any calibration or move
        from oasr.quantization.apply import check_serves

        check_serves(method, target_device, target_dtype)
    _quantize_at_load(source, checkpoint, config, model, quantization, calibration_feed)
    model = model.to(device=target_device, dtype=target_dtype).eval().requires_grad_(False)
    return _assemble(source, checkpoint, config, model, target_device, target_dtype,
                     backend or ("kernels" if target_device.type == "cuda" else "torch"), keep_checkpoint)


def _assemble(source: ModelSource, checkpoint: Checkpoint, config: Any, model: nn.Module, device: torch.device,
              dtype: torch.dtype, backend: Backend, keep_checkpoint: bool) -> LoadedModel:
    arch = ARCHITECTURES.get(checkpoint.architecture)
    extractor_cls = FEATURE_EXTRACTORS.get(arch.feature_extractor)
    return LoadedModel(
        name=str(source),
        architecture=checkpoint.architecture,
        format=checkpoint.format,
        config=config,
        model=model,
        tokenizer=TOKENIZERS.get(checkpoint.tokenizer or arch.tokenizer)(checkpoint.tokenizer_file),
        features=extractor_cls.for_model(config),
        device=device,
        dtype=dtype,
        kernel_gaps=apply_backend(model, backend),
        checkpoint=checkpoint if keep_checkpoint else None,
    )


def _quantize_at_load(source: ModelSource, checkpoint: Checkpoint, config: Any, model: nn.Module,
                      quantization: str | None, feed: Callable[[Any, Sequence[Path]], None] | None) -> None:
    """Applies ``quantization`` now to a float model (on the host, float32, calibrated on the bundled sample
    when the method smooths); a quantized checkpoint already is, and only the same method may be asked of it."""
    if quantization is None or checkpoint.quantization is not None:
        if quantization is not None and quantization != checkpoint.quantization.method:
            from oasr.errors import UnsupportedQuantizationError

            raise UnsupportedQuantizationError(f"{source} is already quantized with "
                                               f"{checkpoint.quantization.method}; cannot serve it as {quantization}")
        return
    from oasr.quantization.apply import quantize_model

    host = _assemble(source, checkpoint, config, model.float().eval().requires_grad_(False), torch.device("cpu"),
                     torch.float32, "torch", keep_checkpoint=False)
    quantize_model(host, quantization, feed=feed)
