"""SmoothQuant: per-channel factors that move activation outliers into the weights, folded into the norm before.

For a norm feeding GEMMs whose weights are W (each [N, K]), and the largest magnitude max|X_j| its output took on
channel j over calibration audio, s_j = max|X_j|^alpha / max|W_j|^(1 - alpha), with max|W_j| over every GEMM of
the group. The norm's weight and bias are divided by s and each GEMM's input column j multiplied by s_j: in
exact arithmetic the model computes the same function, and its activations are easier to quantize per token.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from oasr.quantization.spec import SmoothGroup, Smoothing

# Factors are kept within this range so a dead channel (max|X_j| = 0) or a zero weight column stays finite.
_MIN_FACTOR = 1e-5
_MAX_FACTOR = 1e5


# Runs a loaded model over audio files as a transcription would (``oasr.transcription.offline.calibration_feed``),
# raising on an input that fails. Passed in: the transcriber sits above quantization, which the loader applies.
CalibrationFeed = Callable[[Any, Sequence[Path]], None]


@dataclass(frozen=True)
class Calibration:
    """The audio whose activation ranges set the smoothing factors, and how to name it in the spec."""

    inputs: tuple[Path, ...]
    description: str


def expand_groups(model: nn.Module, declared: Sequence[SmoothGroup]) -> tuple[SmoothGroup, ...]:
    names = {name for name, _ in model.named_modules()}
    return tuple(group for pattern in declared for group in pattern.expand(names))


def activation_ranges(loaded, groups: Sequence[SmoothGroup], calibration: Calibration,
                      feed: CalibrationFeed) -> dict[str, torch.Tensor]:
    """max|X_j| per channel at each group's norm output over the calibration audio, which ``feed`` transcribes as
    usual (the model on the torch backend, so every norm runs as a module the hooks see) -> norm path: float32
    [K]."""
    modules = dict(loaded.model.named_modules())
    ranges: dict[str, torch.Tensor] = {}

    def observer(name: str):
        def hook(module: nn.Module, inputs, output: torch.Tensor) -> None:
            amax = output.detach().abs().reshape(-1, output.shape[-1]).amax(0).float().cpu()
            ranges[name] = amax if name not in ranges else torch.maximum(ranges[name], amax)

        return hook

    handles = [modules[g.norm].register_forward_hook(observer(g.norm)) for g in groups]
    try:
        feed(loaded, calibration.inputs)
    finally:
        for handle in handles:
            handle.remove()
    missed = [g.norm for g in groups if g.norm not in ranges]
    if missed:
        raise ValueError(f"calibration never ran the norms {missed[:4]}: is the smoothing declaration right?")
    return ranges


def smoothing_factors(amax_x: torch.Tensor, weights: Sequence[torch.Tensor], alpha: float) -> torch.Tensor:
    """s [K] from max|X_j| [K] and the group's GEMM weights (each [N, K])."""
    amax_w = torch.stack([w.detach().float().abs().amax(0) for w in weights]).amax(0)
    factors = amax_x.float().pow(alpha) / amax_w.pow(1.0 - alpha)
    return torch.where(torch.isfinite(factors), factors, torch.ones_like(factors)).clamp(_MIN_FACTOR, _MAX_FACTOR)


@torch.no_grad()
def fold(model: nn.Module, group: SmoothGroup, factors: torch.Tensor) -> None:
    """Divides the norm's affine by ``factors`` and multiplies them into the GEMMs' input columns, in place."""
    modules = dict(model.named_modules())
    norm = modules[group.norm]
    norm.weight.div_(factors.to(norm.weight))
    if getattr(norm, "bias", None) is not None:
        norm.bias.div_(factors.to(norm.bias))
    for name in group.gemms:
        weight = modules[name].weight
        weight.mul_(factors.to(weight))


def smooth(model: nn.Module, groups: Sequence[SmoothGroup], ranges: dict[str, torch.Tensor], alpha: float,
           description: str) -> Smoothing:
    """Folds every group's factors into ``model`` (float weights) and says what was done."""
    modules = dict(model.named_modules())
    for group in groups:
        fold(model, group, smoothing_factors(ranges[group.norm], [modules[n].weight for n in group.gemms], alpha))
    return Smoothing(alpha=alpha, calibration=description, groups=tuple(groups))
