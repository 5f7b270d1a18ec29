"""What a quantized checkpoint says about itself, and what a model declares once so it can be smoothed.

Both are plain data and import no torch: the capability records read ``SmoothGroup`` and the native format's
manifest carries a ``QuantizationSpec`` under ``"quantization"``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Any, Literal

WeightScales = Literal["per_channel"]
ActivationScales = Literal["per_token"]
# A smoothing factor's exponent: SmoothQuant moves this much of the activations' range into the weights.
DEFAULT_ALPHA = 0.5


@dataclass(frozen=True)
class SmoothGroup:
    """A norm whose output is the whole input of ``gemms`` (each a ``Linear``'s module path), so a per-channel
    factor can be divided out of the norm's affine and multiplied into the GEMMs' input columns.

    In a model's declaration the paths may hold ``*`` for a layer index: ``model.encoder.layers.*.fc1``. A ``*``
    in the norm binds the same index in the GEMMs; a ``*`` only in the GEMMs spans every layer (the encoder's
    final norm feeds every decoder layer's cross-attention keys and values)."""

    norm: str
    gemms: tuple[str, ...]

    def expand(self, module_names: set[str]) -> list[SmoothGroup]:
        """The concrete groups this declaration names among ``module_names``; a pattern matching nothing is
        an error in the declaration."""
        groups = []
        for norm, index in _matches(self.norm, module_names):
            gemms = []
            for pattern in self.gemms:
                bound = pattern.replace("*", index, 1) if index is not None else pattern
                found = [name for name, _ in _matches(bound, module_names)]
                if not found:
                    raise ValueError(f"smoothing group of {norm}: no module matches {bound!r}")
                gemms.extend(found)
            groups.append(SmoothGroup(norm, tuple(gemms)))
        if not groups:
            raise ValueError(f"smoothing group: no module matches the norm {self.norm!r}")
        return groups


def matching(patterns: tuple[str, ...], names: set[str]) -> set[str]:
    """The names any of ``patterns`` (``*`` for a layer index) matches; a pattern matching nothing is an error in
    the declaration it comes from."""
    found: set[str] = set()
    for pattern in patterns:
        matched = [name for name, _ in _matches(pattern, names)]
        if not matched:
            raise ValueError(f"no module matches {pattern!r}")
        found.update(matched)
    return found


def _matches(pattern: str, names: set[str]) -> list[tuple[str, str | None]]:
    """(name, the index the first ``*`` matched) for every name the pattern matches, in layer order."""
    if "*" not in pattern:
        return [(pattern, None)] if pattern in names else []
    regex = re.compile("^" + r"(\d+)".join(re.escape(part) for part in pattern.split("*")) + "$")
    found = [(name, m) for name in names if (m := regex.match(name))]
    found.sort(key=lambda pair: tuple(int(g) for g in pair[1].groups()))
    return [(name, m.group(1)) for name, m in found]


@dataclass(frozen=True)
class Smoothing:
    """SmoothQuant as it was folded into a checkpoint: s_j = max|X_j|^alpha / max|W_j|^(1 - alpha) per input
    channel j of each group, from the activations seen on ``calibration``."""

    alpha: float
    calibration: str  # what the activation ranges came from: an audio file or a manifest, and how many inputs
    groups: tuple[SmoothGroup, ...]  # concrete module paths

    def __post_init__(self) -> None:
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"smoothing alpha must lie in [0, 1], got {self.alpha}")


@dataclass(frozen=True)
class QuantizationSpec:
    """How a checkpoint's GEMMs are quantized. Saved with the native checkpoint and read back at load, so a
    quantized checkpoint loads without being told.

    ``modules`` are the ``Linear`` paths whose ``weight`` is stored quantized (``int8`` or ``float8_e4m3fn``)
    beside a float32 ``weight_scale`` of one value per output channel; every other tensor keeps a float dtype.
    Activations are quantized when the layer runs, one scale per token (row)."""

    method: str  # a name in QUANT_METHODS
    modules: tuple[str, ...]
    weight_scales: WeightScales = "per_channel"
    activation_scales: ActivationScales = "per_token"
    smoothing: Smoothing | None = None

    def __post_init__(self) -> None:
        if self.weight_scales != "per_channel" or self.activation_scales != "per_token":
            raise ValueError(f"unsupported scale granularity: weights {self.weight_scales!r}, activations "
                             f"{self.activation_scales!r} (per_channel and per_token are implemented)")
        if len(set(self.modules)) != len(self.modules):
            raise ValueError("a quantization spec names a module twice")

    def stored_keys(self) -> set[str]:
        """State-dict keys held in the method's storage or as scales, which a writer must never cast."""
        return {f"{name}.{suffix}" for name in self.modules for suffix in ("weight", "weight_scale")}

    def to_dict(self) -> dict[str, Any]:
        values: dict[str, Any] = {"method": self.method, "modules": list(self.modules),
                                  "weight_scales": self.weight_scales, "activation_scales": self.activation_scales,
                                  "smoothing": None}
        if self.smoothing is not None:
            s = self.smoothing
            values["smoothing"] = {"alpha": s.alpha, "calibration": s.calibration,
                                   "groups": [{"norm": g.norm, "gemms": list(g.gemms)} for g in s.groups]}
        return values

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> QuantizationSpec:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown quantization spec field(s): {', '.join(unknown)}")
        smoothing = values.get("smoothing")
        if smoothing is not None:
            groups = tuple(SmoothGroup(g["norm"], tuple(g["gemms"])) for g in smoothing["groups"])
            smoothing = Smoothing(float(smoothing["alpha"]), str(smoothing["calibration"]), groups)
        return cls(method=values["method"], modules=tuple(values["modules"]),
                   weight_scales=values.get("weight_scales", "per_channel"),
                   activation_scales=values.get("activation_scales", "per_token"), smoothing=smoothing)
