"""Qwen3-ASR's log-mel frontend: Whisper's features of each input on its own, padded to whole 1 s chunks.

Matches ``transformers.Qwen3ASRFeatureExtractor`` on one input (its batch of one): an input shorter than
``min_samples`` (0.5 s) is zero-padded to it and the padding counts as audio; then Whisper's STFT (periodic Hann,
centred, reflect-padded at both ends of the input itself), power without the last frame, Slaney mels, log10,
floor at (max - 8), (x + 4) / 4; ``num_samples // hop`` frames. The mel axis is then zero-padded (value 0.0, not
the floor) to a multiple of ``chunk_frames`` (``2 * n_window`` = 100), which the encoder cuts into chunks.

Every input is featurised alone, so its features do not depend on what it is batched with. (transformers pads a
batch's waveforms to the longest before the STFT, which changes a shorter input's last frames and the values its
last chunk is padded with: its batched features differ from its own.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from oasr.features import FEATURE_EXTRACTORS
from oasr.features.mel import DeviceConstants, slaney_mel_filters


@dataclass(frozen=True)
class Qwen3LogMelConfig:
    num_mel_bins: int = 128
    sample_rate: int = 16_000
    n_fft: int = 400
    hop_length: int = 160
    chunk_frames: int = 100  # the encoder's chunk, 2 * n_window frames (1 s)
    min_samples: int = 8_000  # shorter inputs are zero-padded to this many samples (0.5 s), counted as audio


@FEATURE_EXTRACTORS.register("qwen3_logmel")
class Qwen3LogMel:
    """Audio of any length -> log-mel features [B, num_mel_bins, frames], frames a multiple of ``chunk_frames``."""

    def __init__(self, config: Qwen3LogMelConfig | None = None) -> None:
        self.config = config or Qwen3LogMelConfig()
        c = self.config
        self._constants = DeviceConstants(filters=torch.from_numpy(
            slaney_mel_filters(sample_rate=c.sample_rate, n_fft=c.n_fft, n_mels=c.num_mel_bins)
        ).T.contiguous())  # [n_mels, n_freq]

    @classmethod
    def for_model(cls, config: object) -> Qwen3LogMel:
        """The extractor of a Qwen3-ASR config (its mel count and chunk length)."""
        return cls(Qwen3LogMelConfig(num_mel_bins=config.num_mel_bins,  # type: ignore[attr-defined]
                                     chunk_frames=config.chunk_frames))  # type: ignore[attr-defined]

    def frame_lengths(self, num_samples: torch.Tensor) -> torch.Tensor:
        """Samples [B] -> feature frames that hold audio [B] (the short-input padding included)."""
        c = self.config
        return torch.clamp(num_samples, min=c.min_samples).long() // c.hop_length

    def log_mel(self, waveform: torch.Tensor) -> torch.Tensor:
        """One input, float32 [num_samples] (at least ``min_samples``) -> [n_mels, num_samples // hop]."""
        c = self.config
        window = torch.hann_window(c.n_fft, device=waveform.device)
        stft = torch.stft(waveform, c.n_fft, c.hop_length, window=window, return_complex=True)
        power = stft[..., :-1].abs() ** 2
        log_spec = torch.clamp(self._constants.on(waveform.device)["filters"] @ power, min=1e-10).log10()
        log_spec = torch.maximum(log_spec, log_spec.max() - 8.0)
        return (log_spec + 4.0) / 4.0

    def padded(self, audio: Sequence[np.ndarray | torch.Tensor], device: torch.device | str = "cpu") -> torch.Tensor:
        """The engine's uniform entry: each input's features, zero-padded to the batch's longest whole chunks
        -> float32 [B, n_mels, frames]."""
        if not audio:
            raise ValueError("no audio to featurize")
        c = self.config
        rows = []
        for samples in audio:
            wave = torch.as_tensor(samples, dtype=torch.float32).reshape(-1).to(device)
            if wave.shape[0] < c.min_samples:
                wave = torch.nn.functional.pad(wave, (0, c.min_samples - wave.shape[0]))
            rows.append(self.log_mel(wave))
        longest = max(row.shape[1] for row in rows)
        frames = -(-longest // c.chunk_frames) * c.chunk_frames
        out = torch.zeros(len(rows), c.num_mel_bins, frames, device=device)
        for i, row in enumerate(rows):
            out[i, :, : row.shape[1]] = row
        return out

    def __call__(self, audio: Sequence[np.ndarray | torch.Tensor], device: torch.device | str = "cpu") -> torch.Tensor:
        return self.padded(audio, device)
