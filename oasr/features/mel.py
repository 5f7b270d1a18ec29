"""Mel filter banks, computed (not shipped) so any mel count and rate work."""

from __future__ import annotations

import numpy as np
import torch

# Slaney's mel scale: linear below 1 kHz, logarithmic above (the scale librosa and Whisper use).
_F_SP = 200.0 / 3.0
_MIN_LOG_HZ = 1000.0
_MIN_LOG_MEL = _MIN_LOG_HZ / _F_SP
_LOG_STEP = np.log(6.4) / 27.0


def hz_to_mel_slaney(hz: np.ndarray) -> np.ndarray:
    hz = np.asarray(hz, dtype=np.float64)
    mel = hz / _F_SP
    above = hz >= _MIN_LOG_HZ
    mel[above] = _MIN_LOG_MEL + np.log(hz[above] / _MIN_LOG_HZ) / _LOG_STEP
    return mel


def mel_to_hz_slaney(mel: np.ndarray) -> np.ndarray:
    mel = np.asarray(mel, dtype=np.float64)
    hz = mel * _F_SP
    above = mel >= _MIN_LOG_MEL
    hz[above] = _MIN_LOG_HZ * np.exp(_LOG_STEP * (mel[above] - _MIN_LOG_MEL))
    return hz


def slaney_mel_filters(
    *, sample_rate: int, n_fft: int, n_mels: int, f_min: float = 0.0, f_max: float | None = None
) -> np.ndarray:
    """Area-normalised triangular filters on the Slaney scale -> float32 [n_fft // 2 + 1, n_mels]."""
    f_max = sample_rate / 2 if f_max is None else f_max
    fft_freqs = np.linspace(0.0, sample_rate // 2, n_fft // 2 + 1)
    mel_edges = np.linspace(hz_to_mel_slaney(np.array([f_min]))[0], hz_to_mel_slaney(np.array([f_max]))[0], n_mels + 2)
    hz_edges = mel_to_hz_slaney(mel_edges)
    widths = np.diff(hz_edges)
    slopes = hz_edges[None, :] - fft_freqs[:, None]
    falling = -slopes[:, :-2] / widths[:-1]
    rising = slopes[:, 2:] / widths[1:]
    filters = np.maximum(0.0, np.minimum(falling, rising))
    filters *= 2.0 / (hz_edges[2 : n_mels + 2] - hz_edges[:n_mels])
    return filters.astype(np.float32)


class DeviceConstants:
    """An extractor's constant tensors (filter bank, window), copied to each device once.

    A copy per call would be a transfer from pageable memory, and torch waits for the device to finish its
    queued work before such a transfer: the host could not prepare one batch while the device runs another.
    """

    def __init__(self, **tensors: torch.Tensor) -> None:
        self._host = tensors
        self._copies: dict[torch.device, dict[str, torch.Tensor]] = {}

    def on(self, device: torch.device | str) -> dict[str, torch.Tensor]:
        device = torch.device(device)
        if device.type == "cpu":
            return self._host
        if device not in self._copies:
            self._copies[device] = {name: t.to(device) for name, t in self._host.items()}
        return self._copies[device]
