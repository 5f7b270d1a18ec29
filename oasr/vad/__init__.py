"""Voice activity detection: a detector registry, the segmenter and the long-form window planner.

A detector turns 16 kHz audio into one speech probability per ``chunk_samples`` chunk (the last chunk
zero-padded), for many streams at once (``oasr.vad.detector.SpeechDetector``). ``silero`` is the Silero VAD
network (weights from the ``silero-vad`` package), ``energy`` a loudness detector with no weights.
``oasr.vad.segmenter`` turns probabilities into speech segments; ``oasr.vad.planner`` cuts long audio into
decoding windows at silences; ``oasr.vad.cuts`` (NumPy only, no detector) cuts it into contiguous windows, each
ending at the quietest point before its limit, for the default long-form mode.
Importing this package stays cheap (no torch) so the CLI can list the names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from oasr.registry import Registry

if TYPE_CHECKING:
    import torch

    from oasr.vad.detector import SpeechDetector

VAD_DETECTORS: Registry[type] = Registry(
    "VAD detector",
    lazy={"silero": "oasr.vad.silero", "energy": "oasr.vad.energy"},
)


def load_detector(name: str, device: str | torch.device = "cpu") -> SpeechDetector:
    """The detector registered as ``name``, ready on ``device``."""
    return VAD_DETECTORS.get(name).load(device=device)


__all__ = ["VAD_DETECTORS", "load_detector"]
