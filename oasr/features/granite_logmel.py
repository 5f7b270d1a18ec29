"""Granite Speech's log-mel frontend in torch: as transformers' ``GraniteSpeechFeatureExtractor`` computes it with
torchaudio's ``MelSpectrogram``, without torchaudio.

Power spectrum of a 512-point FFT over 400-sample Hann windows (periodic, centred in the FFT frame) every 160
samples, the input reflect-padded by half an FFT at both ends; 80 HTK mel filters (no area normalisation) from 0
to 8 kHz; log10 floored at 1e-10 and at (the input's peak - 8), then ``/ 4 + 1``. An odd last frame is dropped
and every two frames are stacked into one 160-wide frame (20 ms), the encoder's input. Each input is featurised
alone (its own peak); a batch's rows are zero past their frames.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from oasr.features import FEATURE_EXTRACTORS
from oasr.features.mel import DeviceConstants


@dataclass(frozen=True)
class GraniteLogMelConfig:
    sample_rate: int = 16_000
    n_fft: int = 512
    win_length: int = 400
    hop_length: int = 160
    n_mels: int = 80
    frames_stacked: int = 2  # mel frames per encoder input frame

    @property
    def num_mel_bins(self) -> int:
        """Width of a stacked frame (the encoder's ``input_dim``)."""
        return self.n_mels * self.frames_stacked


def htk_mel_filters(sample_rate: int, n_fft: int, n_mels: int) -> np.ndarray:
    """Triangular HTK-scale mel filters over [0, sample_rate / 2], unnormalised -> [n_mels, n_fft // 2 + 1]."""
    freqs = np.linspace(0.0, sample_rate / 2, n_fft // 2 + 1)
    top = 2595.0 * np.log10(1.0 + (sample_rate / 2) / 700.0)
    edges = 700.0 * (10.0 ** (np.linspace(0.0, top, n_mels + 2) / 2595.0) - 1.0)
    widths = np.diff(edges)
    slopes = edges[None, :] - freqs[:, None]  # [freqs, n_mels + 2]
    rising = -slopes[:, :-2] / widths[:-1]
    falling = slopes[:, 2:] / widths[1:]
    return np.maximum(0.0, np.minimum(rising, falling)).T


@FEATURE_EXTRACTORS.register("granite_logmel")
class GraniteLogMel:
    """Audio -> stacked log-mel features [B, 160, frames] (frames at 20 ms), each row its own input's."""

    def __init__(self, config: GraniteLogMelConfig | None = None) -> None:
        self.config = config or GraniteLogMelConfig()
        c = self.config
        self._constants = DeviceConstants(
            filters=torch.from_numpy(htk_mel_filters(c.sample_rate, c.n_fft, c.n_mels)).float(),
            window=torch.hann_window(c.win_length))

    @classmethod
    def for_model(cls, config: object) -> GraniteLogMel:
        return cls()

    def frame_lengths(self, num_samples: torch.Tensor) -> torch.Tensor:
        """Samples [B] -> stacked frames [B]: ``(samples // hop + 1) // 2``."""
        return ((num_samples // self.config.hop_length + 1) // self.config.frames_stacked).long()

    def padded(self, audio: Sequence[np.ndarray | torch.Tensor], device: torch.device | str = "cpu") -> torch.Tensor:
        rows = [self.features(torch.as_tensor(a, dtype=torch.float32).to(device)) for a in audio]
        out = torch.zeros(len(rows), self.config.num_mel_bins, max(r.shape[-1] for r in rows), device=device)
        for i, row in enumerate(rows):
            out[i, :, : row.shape[-1]] = row
        return out

    def __call__(self, audio: Sequence[np.ndarray | torch.Tensor], device: torch.device | str = "cpu") -> torch.Tensor:
        return self.padded(audio, device)

    def features(self, waveform: torch.Tensor) -> torch.Tensor:
        """One input, float32 [N] -> [160, (N // hop + 1) // 2]."""
        c = self.config
        constants = self._constants.on(waveform.device)
        stft = torch.stft(waveform, c.n_fft, c.hop_length, win_length=c.win_length, window=constants["window"],
                          center=True, pad_mode="reflect", return_complex=True)
        mel = (constants["filters"] @ stft.abs() ** 2).T  # [frames, n_mels]
        log_spec = mel.clamp(min=1e-10).log10()
        log_spec = torch.maximum(log_spec, log_spec.max() - 8.0) / 4.0 + 1.0
        usable = log_spec.shape[0] // c.frames_stacked * c.frames_stacked
        return log_spec[:usable].reshape(-1, c.num_mel_bins).T
