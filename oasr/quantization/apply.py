"""Quantizing a model in place, and preparing one to load a quantized checkpoint.

Every ``Linear`` whose class is ``QUANTIZABLE`` (the waist's GEMMs; not ``Float32Head``) is quantized, so every
architecture is served. The model is quantized on the host in float32, then moved: the layers keep their storage
and pick their method's lane for the device they land on.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch import nn

from oasr.errors import UnsupportedQuantizationError
from oasr.layers import Linear
from oasr.quantization import DEFAULT_ALPHA, QUANT_METHODS, QuantizationSpec
from oasr.quantization.method import QuantMethod, check_dtype
from oasr.quantization.smooth import Calibration, CalibrationFeed, activation_ranges, expand_groups, smooth
from oasr.quantization.spec import matching
from oasr.registry import UnknownEntryError

log = logging.getLogger(__name__)

BUNDLED_SAMPLE = Path(__file__).resolve().parents[1] / "assets" / "jfk.flac"


def default_calibration() -> Calibration:
    return Calibration((BUNDLED_SAMPLE,), "oasr/assets/jfk.flac (the bundled sample)")


def method_named(name: str) -> QuantMethod:
    try:
        return QUANT_METHODS.get(name)()
    except UnknownEntryError as exc:
        raise UnsupportedQuantizationError(str(exc)) from None


def quantizable(model: nn.Module) -> dict[str, Linear]:
    """Module path -> layer, for every GEMM of the waist a method may quantize."""
    return {name: m for name, m in model.named_modules() if isinstance(m, Linear) and type(m).QUANTIZABLE}


def check_serves(method_name: str, device: torch.device, dtype: torch.dtype) -> None:
    """Refuses, naming it, a method, device or dtype that cannot be served (before anything is moved)."""
    method = method_named(method_name)
    method.check_device(torch.device(device))
    check_dtype(method, dtype)


@torch.no_grad()
def quantize_weights(model: nn.Module, method: QuantMethod, modules: tuple[str, ...]) -> None:
    """Quantizes the named layers' (float) weights in place; the layers run the method on their device."""
    layers = quantizable(model)
    for name in modules:
        layer = layers[name]
        weight, scale = method.quantize_weight(layer.weight)
        layer.set_quantized(method.bind(layer.weight.device, tuple(weight.shape)), weight, scale)


def quantized_modules(model: nn.Module, *, decode_steps: bool = False) -> tuple[str, ...]:
    """The GEMMs a quantization of ``model`` covers: every quantizable one, less the architecture's decode-step
    GEMMs unless ``decode_steps``."""
    modules = tuple(quantizable(model))
    if decode_steps or not type(model).capabilities.decode_step_gemms:
        return modules
    steps = matching(type(model).capabilities.decode_step_gemms, set(modules))
    return tuple(name for name in modules if name not in steps)


def quantize_model(loaded, method_name: str, *, calibration: Calibration | None = None,
                   feed: CalibrationFeed | None = None, alpha: float = DEFAULT_ALPHA,
                   decode_steps: bool = False) -> QuantizationSpec:
    """Quantizes ``loaded.model`` (float weights, on the host, torch backend) in place and returns its spec.
    A method that smooths (int8) folds SmoothQuant factors from ``calibration`` (default: the bundled sample)
    into the norms the architecture declares first (those feeding a quantized GEMM); one that does not (fp8)
    ignores ``calibration``. ``feed`` runs the model over the calibration audio (``activation_ranges``); a
    smoothing method needs it. ``decode_steps``: also the GEMMs of each decode step (``quantized_modules``)."""
    method = method_named(method_name)
    model = loaded.model
    modules = quantized_modules(model, decode_steps=decode_steps)
    already = [name for name in quantizable(model) if model.get_submodule(name).quant_gemm is not None]
    if already:
        raise UnsupportedQuantizationError(f"{loaded.name} is already quantized ({already[0]} ...)")
    smoothing = None
    declared = type(model).capabilities.smooth_groups
    if method.smooths and declared:
        if feed is None:
            raise ValueError(f"{method.name} calibrates on audio: quantize_model needs feed (a CalibrationFeed)")
        calibration = calibration or default_calibration()
        chosen = set(modules)
        groups = tuple(g for g in expand_groups(model, declared) if chosen.intersection(g.gemms))
        ranges = activation_ranges(loaded, groups, calibration, feed)
        smoothing = smooth(model, groups, ranges, alpha, calibration.description)
        log.info("smoothed %d groups from %s", len(groups), calibration.description)
    elif method.smooths:
        log.info("%s declares no smoothing groups: %s without smoothing", loaded.architecture, method.name)
    quantize_weights(model, method, modules)
    return QuantizationSpec(method=method.name, modules=modules, smoothing=smoothing)


def prepare_quantized(model: nn.Module, spec: QuantizationSpec) -> None:
    """Gives the spec's layers empty quantized storage (and scales) for ``load_state_dict`` to fill, so the
    checkpoint's bytes load as they are. Refuses a spec naming a module the model has no quantizable GEMM at."""
    method = method_named(spec.method)
    layers = quantizable(model)
    missing = [name for name in spec.modules if name not in layers]
    if missing:
        raise UnsupportedQuantizationError(
            f"the quantization spec names {len(missing)} module(s) that are not quantizable GEMMs of "
            f"{type(model).__name__}: {missing[:4]}")
    for name in spec.modules:
        layer = layers[name]
        shape = (layer.out_features, layer.in_features)
        weight = torch.empty(shape, dtype=method.storage_dtype, device=layer.weight.device)
        scale = torch.ones(layer.out_features, dtype=torch.float32, device=layer.weight.device)
        layer.set_quantized(method.bind(layer.weight.device, shape), weight, scale)

