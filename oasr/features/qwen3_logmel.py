"""Qwen3-ASR's log-mel frontend: Whisper's features of each input on its own, padded to whole 1 s chunks.

Matches ``transformers.Qwen3ASRFeatureExtractor`` on one input (its batch of one): an input shorter than
``min_samples`` (0.5 s) is zero-padded to it and the padding counts as audio; then Whisper's STFT (periodic Hann,
centred, reflect-padded at both ends of the input itself), power without the last frame, Slaney mels, log10,
floor at (max - 8), (x + 4) / 4; ``num_samples // hop`` frames. The mel axis is then zero-padded (value 0.0, not
the floor) to a multiple of ``chunk_frames`` (``2 * n_window`` = 100), which the encoder cuts into chunks.

Every input's features are those it has alone, whatever it is batched with: a batch runs as one STFT, each row
with its own reflect padding and its own peak. (transformers pads a batch's waveforms to the longest before the
STFT, which changes a shorter input's last frames and the values its last chunk is padded with: its batched
features differ from its own.)
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
        """One input, float32 [num_samples] -> [n_mels, num_samples // hop] (its features alone, unpadded)."""
        frames = int(self.frame_lengths(torch.tensor([waveform.shape[-1]]))[0])
        return self.padded([waveform.reshape(-1)], device=waveform.device)[0, :, :frames]

    def padded(self, audio: Sequence[np.ndarray | torch.Tensor], device: torch.device | str = "cpu") -> torch.Tensor:
        """The engine's uniform entry: each input's features, zero-padded to the batch's longest whole chunks
        -> float32 [B, n_mels, frames].

        Each row is exactly its input's features alone: its own reflect padding at both of its ends
        (``torch.stft``'s centring), its own peak for the floor, zeros past its frames. On CUDA the whole batch
        is one upload and one STFT (a row at a time would wait on the device for every input); on the host,
        where a giant batched STFT runs many times slower than the same frames row by row, one row at a time."""
        if not audio:
            raise ValueError("no audio to featurize")
        c = self.config
        sizes = [max(int(torch.as_tensor(a).numel()), c.min_samples) for a in audio]
        total = -(-(max(sizes) // c.hop_length) // c.chunk_frames) * c.chunk_frames
        if torch.device(device).type == "cuda":
            return self.at_once(audio, device, total)
        out = torch.zeros(len(audio), c.num_mel_bins, total, device=device)
        for i, (samples, size) in enumerate(zip(audio, sizes, strict=True)):
            frames = size // c.hop_length
            out[i, :, :frames] = self.at_once([samples], device, frames)[0]
        return out

    def at_once(self, audio: Sequence[np.ndarray | torch.Tensor], device: torch.device | str,
                total: int) -> torch.Tensor:
        """Features of inputs as each has them alone, in one batch -> [B, n_mels, total] (zeros past each row's
        frames; ``total`` at least the longest row's frames)."""
        c = self.config
        half = c.n_fft // 2
        if c.min_samples <= half:
            raise ValueError(f"min_samples {c.min_samples} must exceed n_fft // 2 = {half} (the reflect padding)")
        waves, have = pad_to_device(audio, device)
        device = waves.device
        counted = torch.clamp(have, min=c.min_samples)  # short inputs: the zeros up to min_samples are audio
        width = max(int(waves.shape[1]), c.min_samples)
        signal = torch.zeros(waves.shape[0], width + 2 * half, device=device)
        signal[:, half : half + waves.shape[1]] = waves
        signal[:, :half] = signal[:, half + 1 : 2 * half + 1].flip(1)  # every row starts at 0: one slice serves
        k = torch.arange(half, device=device)
        ends = (half + counted)[:, None]
        signal.scatter_(1, ends + k, signal.gather(1, ends - 2 - k))  # each row's mirror after its own end
        window = torch.hann_window(c.n_fft, device=device)
        stft = torch.stft(signal, c.n_fft, c.hop_length, window=window, center=False, return_complex=True)
        log_spec = torch.clamp(self._constants.on(device)["filters"] @ (stft.abs() ** 2), min=1e-10).log10()
        frames = counted // c.hop_length
        valid = torch.arange(log_spec.shape[-1], device=device)[None, None, :] < frames[:, None, None]
        peak = torch.where(valid, log_spec, float("-inf")).amax(dim=(1, 2), keepdim=True)
        features = torch.where(valid, (torch.maximum(log_spec, peak - 8.0) + 4.0) / 4.0, 0.0)
        if total > features.shape[-1]:
            features = torch.nn.functional.pad(features, (0, total - features.shape[-1]))
        return features[..., :total].contiguous()

    def __call__(self, audio: Sequence[np.ndarray | torch.Tensor], device: torch.device | str = "cpu") -> torch.Tensor:
        return self.padded(audio, device)
