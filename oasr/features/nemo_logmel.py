"""NeMo's log-mel frontend (``AudioToMelSpectrogramPreprocessor``) in torch: batched, on the caller's device.

Matches ``transformers.ParakeetFeatureExtractor``: pre-emphasis (0.97) inside each input's length, STFT
(512-point FFT, 400-sample symmetric Hann window, 160-sample hop, centred with zero padding), power spectrum,
Slaney mel filters, natural log with a 2^-24 guard, then per-feature normalisation over each input's real
frames (mean, unbiased std + 1e-5) with padded frames set to 0. No dither: NeMo dithers only in training, and
the reference extractor never does.

``nemotron_logmel`` is the same frontend without the normalisation (``normalize=False``), as transformers'
``NemotronAsrStreamingFeatureExtractor``: the log-mel of the real frames, zero past them.
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
class NemoLogMelConfig:
    num_mel_bins: int = 80
    sample_rate: int = 16_000
    n_fft: int = 512
    win_length: int = 400  # 25 ms
    hop_length: int = 160  # 10 ms
    preemphasis: float = 0.97  # 0 disables it
    log_zero_guard: float = 2.0**-24  # added before the log so silence stays finite
    normalize_epsilon: float = 1e-5  # added to the std
    normalize: bool = True  # per-feature mean/std over each input's real frames (NeMo's "per_feature")

    def __post_init__(self) -> None:
        if self.win_length > self.n_fft:
            raise ValueError(f"win_length {self.win_length} exceeds n_fft {self.n_fft}")


@FEATURE_EXTRACTORS.register("nemo_logmel")
class NemoLogMel:
    """Audio of any lengths -> (features [B, num_mel_bins, T], lengths [B]); T = longest samples // hop + 1."""

    def __init__(self, config: NemoLogMelConfig | None = None) -> None:
        self.config = config or NemoLogMelConfig()
        c = self.config
        filters = slaney_mel_filters(sample_rate=c.sample_rate, n_fft=c.n_fft, n_mels=c.num_mel_bins)
        self._constants = DeviceConstants(
            filters=torch.from_numpy(filters).T.contiguous(),  # [n_mels, n_fft // 2 + 1]
            window=torch.hann_window(c.win_length, periodic=False),
        )

    @classmethod
    def for_model(cls, config: object) -> NemoLogMel:
        """The extractor a FastConformer checkpoint expects (the mel count comes from its encoder)."""
        encoder = getattr(config, "encoder_config", config)
        return cls(NemoLogMelConfig(num_mel_bins=getattr(encoder, "num_mel_bins", 80)))

    def frame_lengths(self, num_samples: torch.Tensor) -> torch.Tensor:
        """Samples [B] -> real feature frames [B] (frames whose window centre lies inside the audio)."""
        return torch.div(num_samples, self.config.hop_length, rounding_mode="floor")

    @staticmethod
    def pad_batch(
        audio: Sequence[np.ndarray | torch.Tensor], device: torch.device | str
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Zero-pad every input to the longest -> (float32 [B, N] on ``device``, samples [B] int64)."""
        return pad_to_device(audio, device)

    def __call__(
        self,
        audio: Sequence[np.ndarray | torch.Tensor] | torch.Tensor,
        device: torch.device | str = "cpu",
        num_samples: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """audio: 1-D 16 kHz float arrays, or a zero-padded [B, N] tensor with its ``num_samples`` [B]
        -> (features [B, num_mel_bins, T], lengths [B])."""
        if isinstance(audio, torch.Tensor) and audio.dim() == 2:
            waveforms = audio.to(device=device, dtype=torch.float32)
            if num_samples is None:
                num_samples = torch.full((audio.shape[0],), audio.shape[1], dtype=torch.long)
            num_samples = num_samples.to(device=waveforms.device, dtype=torch.long)
        else:
            waveforms, num_samples = self.pad_batch(list(audio), device)
        return self.log_mel(waveforms, num_samples)

    def padded(self, audio: Sequence[np.ndarray | torch.Tensor], device: torch.device | str = "cpu") -> torch.Tensor:
        """The engine's uniform entry (as ``WhisperLogMel.padded``): features [B, n_mels, T] padded to the
        longest row (``frame_lengths`` gives each row's real frames)."""
        return self(audio, device)[0]

    def log_mel(self, waveforms: torch.Tensor, num_samples: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """waveforms: float32 [B, N] zero-padded; num_samples: [B] -> (features [B, n_mels, T], lengths [B])."""
        c = self.config
        inside = torch.arange(waveforms.shape[1], device=waveforms.device)[None, :] < num_samples[:, None]
        if c.preemphasis:
            waveforms = torch.cat([waveforms[:, :1], waveforms[:, 1:] - c.preemphasis * waveforms[:, :-1]], dim=1)
        # Zero past each input's end: pre-emphasis leaks the last sample into the padding, and a short input
        # batched with long ones must see the same silence it would alone.
        waveforms = waveforms.masked_fill(~inside, 0.0)
        constants = self._constants.on(waveforms.device)
        stft = torch.stft(
            waveforms, c.n_fft, hop_length=c.hop_length, win_length=c.win_length, window=constants["window"],
            center=True, pad_mode="constant", return_complex=True,
        )
        power = stft.real.square() + stft.imag.square()
        mel = torch.log(constants["filters"] @ power + c.log_zero_guard)  # [B, n_mels, T]
        lengths = self.frame_lengths(num_samples)
        if not c.normalize:
            return mel * frame_mask(lengths, mel.shape[2])[:, None, :], lengths
        return self.normalize(mel, lengths), lengths

    def window_frames(self, windows: torch.Tensor) -> torch.Tensor:
        """Pre-emphasised sample windows [B, (K - 1) * hop + n_fft] (``oasr.streaming.audio``) -> the log-mel
        of their K frames, [B, n_mels, K], each the frame ``log_mel`` computes at the same samples; not
        normalised (a stream has no whole-input statistics)."""
        c = self.config
        if c.normalize:
            raise ValueError("per-feature normalised features need the whole input; they cannot be streamed")
        constants = self._constants.on(windows.device)
        stft = torch.stft(windows, c.n_fft, hop_length=c.hop_length, win_length=c.win_length,
                          window=constants["window"], center=False, return_complex=True)
        power = stft.real.square() + stft.imag.square()
        return torch.log(constants["filters"] @ power + c.log_zero_guard)

    def normalize(self, mel: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Per-feature mean/std over each row's real frames; padded frames become 0. mel: [B, n_mels, T]."""
        frames = frame_mask(lengths, mel.shape[2])[:, None, :]
        # Rows of 0 or 1 frames would divide by zero (the reference returns NaN); clamp to keep them finite.
        count = lengths.clamp(min=1)[:, None, None].to(mel.dtype)
        mean = (mel * frames).sum(dim=2, keepdim=True) / count
        variance = (((mel - mean) * frames) ** 2).sum(dim=2, keepdim=True) / (count - 1).clamp(min=1)
        normalized = (mel - mean) / (variance.sqrt() + self.config.normalize_epsilon)
        return normalized * frames


def frame_mask(lengths: torch.Tensor, num_frames: int) -> torch.Tensor:
    """lengths: [B] -> bool [B, num_frames], True on each row's real frames."""
    return torch.arange(num_frames, device=lengths.device)[None, :] < lengths[:, None]


@FEATURE_EXTRACTORS.register("nemotron_logmel")
class NemotronLogMel(NemoLogMel):
    """NeMo's log-mel without per-feature normalisation (Nemotron ASR streaming checkpoints)."""

    @classmethod
    def for_model(cls, config: object) -> NemotronLogMel:
        encoder = config.encoder_config  # type: ignore[attr-defined]
        return cls(NemoLogMelConfig(num_mel_bins=encoder.num_mel_bins, normalize=False))
