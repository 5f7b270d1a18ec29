"""Where long audio is cut into requests: contiguous windows cut at the quietest point before each window's limit,
or windows cut at the silences a VAD detector finds.

Offline transcription and the server cut alike. Torch-free (a VAD detector loads torch when one is asked for),
so the server's API processes can plan without it.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import numpy as np

from oasr.audio import load_audio
from oasr.errors import AudioDecodeError
from oasr.models.capabilities import ModelCapabilities
from oasr.vad.cuts import quiet_spans

if TYPE_CHECKING:
    import torch

AudioInput = str | os.PathLike | bytes | np.ndarray
Span = tuple[int, int]  # samples [start, end) of one input decoded as one request


def describe(item: AudioInput, index: int) -> str:
    if isinstance(item, (str, os.PathLike)):
        return str(item)
    return f"<input {index}>"


def to_samples(item: AudioInput, name: str, max_seconds: float | None = None) -> np.ndarray:
    """``item`` as 16 kHz mono float32; a file or bytes longer than ``max_seconds`` (None: no limit) is refused
    while decoding (``AudioTooLongError``), before it is decoded whole."""
    if isinstance(item, np.ndarray):
        samples = np.asarray(item, dtype=np.float32).reshape(-1)
        if samples.size == 0:
            raise AudioDecodeError(name, "zero samples")
        return samples
    return load_audio(item, name=name, max_seconds=max_seconds)


def split_windows(samples: np.ndarray, window: int) -> list[np.ndarray]:
    return [samples[start : start + window] for start in range(0, len(samples), window)]


def fixed_spans(num_samples: int, window: int) -> list[Span]:
    return [(start, min(start + window, num_samples)) for start in range(0, num_samples, window)]


def long_audio_detector(capabilities: ModelCapabilities, vad: str | None) -> str | None:
    """The VAD detector that cuts long audio: the one asked for, else the built-in energy detector for decoders
    without timestamp tokens (they cannot say where a window's speech stops, so a window cut mid-word loses or
    garbles that word), else none (fixed windows)."""
    if vad is not None:
        return vad
    if capabilities.runner == "autoregressive" and "timestamps" not in capabilities.options:
        return "energy"
    return None


class SpanPlanner:
    """Where to cut one input: one window if it fits, else into contiguous windows of at most ``window`` samples
    each ending at a quiet point (``oasr.vad.cuts``: a fixed 30 s cut splits the word it lands in, and each
    window decodes half of it), or at the silences a VAD ``detector`` finds (offline and the server cut alike)."""

    def __init__(self, detector: str | None, window: int, device: str | torch.device = "cpu") -> None:
        self.window = window
        self.planner = None
        if detector is not None:
            from oasr.vad import load_detector  # detectors run on torch; fixed windows need none
            from oasr.vad.planner import WindowPlanner

            self.planner = WindowPlanner(load_detector(detector, device), window)

    def __call__(self, samples: np.ndarray) -> list[Span]:
        if len(samples) <= self.window:
            return fixed_spans(len(samples), self.window)
        if self.planner is None:
            return quiet_spans(samples, self.window)
        return [(w.start, w.end) for w in self.planner.plan([samples])[0]]
