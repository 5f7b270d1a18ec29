"""Whisper's log-mel for the speech LLMs: over whole 30 s windows (Voxtral), or one window with its valid
frames counted (Qwen2-Audio).

Voxtral's processor pads each input with zeros to the next multiple of 30 s, computes Whisper's log-mel over the
whole padded input at once (so the floor at ``max - 8`` uses the peak of the whole input, not of each window),
then cuts the frames into 3,000-frame windows that its encoder reads one by one. ``padded`` does the same for a
batch: each row holds its own input's windows, zeros after them up to the batch's most windows.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from oasr.features import FEATURE_EXTRACTORS
from oasr.features.whisper_logmel import WhisperLogMel, WhisperLogMelConfig


@FEATURE_EXTRACTORS.register("chunked_whisper_logmel")
class ChunkedWhisperLogMel(WhisperLogMel):
    """Audio of any length -> [B, num_mel_bins, windows * 3000], each row its input's whole windows."""

    @classmethod
    def for_model(cls, config: object) -> ChunkedWhisperLogMel:
        return cls(WhisperLogMelConfig(num_mel_bins=getattr(config, "num_mel_bins", 128)))

    def num_windows(self, num_samples: int) -> int:
        """30 s windows an input of ``num_samples`` fills (at least one: an empty input is one silent window)."""
        return max(1, -(-int(num_samples) // self.config.n_samples))

    def padded(self, audio: Sequence[np.ndarray | torch.Tensor], device: torch.device | str = "cpu") -> torch.Tensor:
        c = self.config
        windows = [self.num_windows(len(a)) for a in audio]
        out = torch.zeros(len(audio), c.num_mel_bins, max(windows) * c.n_frames, device=device)
        for row, (samples, count) in enumerate(zip(audio, windows, strict=True)):
            wave = torch.zeros(1, count * c.n_samples, device=device)
            wave[0, : len(samples)] = torch.as_tensor(samples, dtype=torch.float32).to(device)
            out[row, :, : count * c.n_frames] = self.log_mel(wave)[0]
        return out

    def __call__(self, audio: Sequence[np.ndarray | torch.Tensor], device: torch.device | str = "cpu") -> torch.Tensor:
        return self.padded(audio, device)

    def frame_lengths(self, num_samples: torch.Tensor) -> torch.Tensor:
        """Samples [B] -> feature frames [B]: whole windows, 3,000 frames each."""
        windows = torch.clamp((num_samples + self.config.n_samples - 1) // self.config.n_samples, min=1)
        return (windows * self.config.n_frames).long()


@FEATURE_EXTRACTORS.register("masked_whisper_logmel")
class MaskedWhisperLogMel(WhisperLogMel):
    """Whisper's 30 s window, with the frames the audio reaches counted (Qwen2-Audio masks the rest out of its
    encoder's attention): ``ceil(samples / hop)`` frames, at most the window's, as the feature extractor's
    attention mask (``return_attention_mask=True``) counts them."""

    @classmethod
    def for_model(cls, config: object) -> MaskedWhisperLogMel:
        return cls(WhisperLogMelConfig(num_mel_bins=getattr(config, "num_mel_bins", 128)))

    def frame_lengths(self, num_samples: torch.Tensor) -> torch.Tensor:
        c = self.config
        return torch.clamp((num_samples + c.hop_length - 1) // c.hop_length, max=c.n_frames).long()
