"""Voice activity detection: a detector registry, the segmenter and the long-form window planner.

A detector turns 16 kHz audio into one speech probability per ``chunk_samples`` chunk (the last chunk
zero-padded), for many streams at once (``oasr.vad.detector.SpeechDetector``). ``silero`` is the Silero VAD
network (weights from the ``silero-vad`` package), ``energy`` a loudness detector with no weights, ``fsmn``
FunASR's FSMN-VAD (weights from a FunASR model folder, which also cuts its own segments).
``oasr.vad.segmenter`` turns probabilities into speech segments; ``oasr.vad.planner`` cuts long audio into
decoding windows at silences; ``oasr.vad.cuts`` (NumPy only, no detector) cuts it into contiguous windows, each
ending at the quietest point before its limit, for the default long-form mode.
Importing this package stays cheap (no torch) so the CLI can list the names.

A detector is named by a spec, ``NAME`` or ``NAME:FOLDER`` (``fsmn:/models/fsmn-vad``): one string, so that the
options, settings and sessions that carry a detector's name carry its folder too. Each detector class declares
``model_folder`` ("none", "optional" or "required") and is built as ``load(device=...)``, plus
``model_dir=FOLDER`` when it takes one; a spec that gives a folder to a detector that takes none, or none to one
that needs it, is refused naming the detector.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from oasr.errors import OASRError
from oasr.registry import Registry

if TYPE_CHECKING:
    import torch

    from oasr.vad.detector import SpeechDetector

VAD_DETECTORS: Registry[type] = Registry(
    "VAD detector",
    # fsmn's network reads FunASR checkpoints, so it lives with the models (named here, not imported).
    lazy={"silero": "oasr.vad.silero", "energy": "oasr.vad.energy", "fsmn": "oasr.models.fsmn_vad.detector"},
)
MODEL_FOLDER_KINDS = ("none", "optional", "required")


class DetectorSpecError(OASRError, ValueError):
    """A detector spec names no registered detector, or gives a folder where none fits (or none where needed)."""


@dataclass(frozen=True)
class DetectorSpec:
    name: str  # a VAD_DETECTORS entry
    model_dir: str | None = None  # the detector's model folder, for detectors that read one

    @classmethod
    def parse(cls, spec: str) -> DetectorSpec:
        """``NAME`` or ``NAME:FOLDER`` -> the spec, its name checked against the registry (its folder is read
        when the detector loads)."""
        name, sep, folder = spec.partition(":")
        if name not in VAD_DETECTORS:
            raise DetectorSpecError(f"unknown VAD detector {name!r}; registered: {', '.join(VAD_DETECTORS.names())}")
        if sep and not folder:
            raise DetectorSpecError(f"VAD detector spec {spec!r} names no folder after ':'")
        return cls(name, folder or None)

    def __str__(self) -> str:
        return self.name if self.model_dir is None else f"{self.name}:{self.model_dir}"


def detector_name(spec: str) -> str:
    """The registered detector a spec names (``DetectorSpecError`` if none)."""
    return DetectorSpec.parse(spec).name


def load_detector(spec: str, device: str | torch.device = "cpu") -> SpeechDetector:
    """The detector ``spec`` names (``NAME`` or ``NAME:FOLDER``), ready on ``device``."""
    parsed = DetectorSpec.parse(spec)
    cls = VAD_DETECTORS.get(parsed.name)
    kind = cls.model_folder
    if kind not in MODEL_FOLDER_KINDS:
        raise TypeError(f"VAD detector {parsed.name!r} declares model_folder {kind!r}, not one of "
                        f"{', '.join(MODEL_FOLDER_KINDS)}")
    if kind == "none" and parsed.model_dir is not None:
        raise DetectorSpecError(f"the {parsed.name} VAD takes no model folder (got {parsed.model_dir!r})")
    if kind == "required" and parsed.model_dir is None:
        raise DetectorSpecError(f"the {parsed.name} VAD needs its model folder: {parsed.name}:FOLDER")
    if kind == "none":
        return cls.load(device=device)
    return cls.load(device=device, model_dir=parsed.model_dir)


__all__ = ["VAD_DETECTORS", "DetectorSpec", "DetectorSpecError", "detector_name", "load_detector"]
