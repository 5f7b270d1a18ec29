"""Whisper's log-mel frontend in torch: batched, on whatever device the caller picks.

Matches ``transformers.WhisperFeatureExtractor`` (and openai-whisper's ``log_mel_spectrogram``): each input is
zero-padded or cut to a 30 s window, STFT with a periodic Hann window (reflect-padded, centred), power
spectrum without the Nyquist frame, Slaney mel filters, log10, floor at (max - 8), then (x + 4) / 4.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from oasr.features import FEATURE_EXTRACTORS
from oasr.features.mel import DeviceConstants, slaney_mel_filters
from oasr.features.upload import pad_to_device


@dataclass(frozen=True)
class WhisperLogMelConfig:
    num_mel_bins: int = 80
    sample_rate: int = 16_000
    n_fft: int = 400
    hop_length: int = 160
    chunk_length_s: int = 30

    @property
    def n_samples(self) -> int:
        return self.chunk_length_s * self.sample_rate

    @property
    def n_frames(self) -> int:
        return self.n_samples // self.hop_length


@FEATURE_EXTRACTORS.register("whisper_logmel")
class WhisperLogMel:
    """Audio windows -> log-mel features [B, num_mel_bins, n_frames] (3000 frames for 30 s)."""

    def __init__(self, config: WhisperLogMelConfig | None = None) -> None:
        self.config = config or WhisperLogMelConfig()
        c = self.config
        self._constants = DeviceConstants(filters=torch.from_numpy(
            slaney_mel_filters(sample_rate=c.sample_rate, n_fft=c.n_fft, n_mels=c.num_mel_bins)
        ).T.contiguous())  # [n_mels, n_freq]

    @classmethod
    def for_model(cls, config: object) -> WhisperLogMel:
        """The extractor a Whisper checkpoint was trained with (only the mel count varies)."""
        return cls(WhisperLogMelConfig(num_mel_bins=getattr(config, "num_mel_bins", 80)))

    def pad_batch(self, audio: Sequence[np.ndarray | torch.Tensor], device: torch.device | str) -> torch.Tensor:
        """Pad or cut every input to one window -> float32 [B, n_samples] on ``device``."""
        return pad_to_device(audio, device, width=self.config.n_samples)[0]

    def __call__(
        self, audio: Sequence[np.ndarray | torch.Tensor] | torch.Tensor, device: torch.device | str = "cpu"
    ) -> torch.Tensor:
        """audio: list of 1-D 16 kHz float arrays, or a padded [B, n_samples] tensor -> [B, n_mels, n_frames]."""
        if isinstance(audio, torch.Tensor) and audio.dim() == 2 and audio.shape[1] == self.config.n_samples:
            waveforms = audio.to(device=device, dtype=torch.float32)
        else:
            waveforms = self.pad_batch(list(audio), device)
        return self.log_mel(waveforms)

    def padded(self, audio: Sequence[np.ndarray | torch.Tensor], device: torch.device | str = "cpu") -> torch.Tensor:
        """The engine's uniform entry (as ``NemoLogMel.padded``): features of a batch, every row one window."""
        return self(audio, device)

    def frame_lengths(self, num_samples: torch.Tensor) -> torch.Tensor:
        """Samples [B] -> feature frames the encoder reads [B]: a whole window whatever the audio's length."""
        return torch.full_like(num_samples, self.config.n_frames, dtype=torch.long)

    def log_mel(self, waveforms: torch.Tensor) -> torch.Tensor:
        """waveforms: float32 [B, n_samples] -> [B, n_mels, n_frames]."""
        c = self.config
        window = torch.hann_window(c.n_fft, device=waveforms.device)
        stft = torch.stft(waveforms, c.n_fft, c.hop_length, window=window, return_complex=True)
        power = stft[..., :-1].abs() ** 2
        mel = self._constants.on(waveforms.device)["filters"] @ power
        log_spec = torch.clamp(mel, min=1e-10).log10()
        peak = log_spec.amax(dim=(1, 2), keepdim=True)
        log_spec = torch.maximum(log_spec, peak - 8.0)
        return (log_spec + 4.0) / 4.0
