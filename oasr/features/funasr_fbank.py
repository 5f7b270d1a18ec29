"""FunASR's ``WavFrontend`` in batched torch: Kaldi fbank, low-frame-rate stacking (LFR) and CMVN from ``am.mvn``.

Kaldi's fbank as ``torchaudio.compliance.kaldi.fbank`` and kaldi-native-fbank compute it (FunASR calls one of the
two, one waveform at a time): samples scaled to 16-bit range, 25 ms frames every 10 ms that lie wholly inside the
input (``snip_edges``), each frame's DC offset removed, pre-emphasis 0.97 (the first sample against itself), a
Hamming or Povey window, a 512-point FFT, the power spectrum through Kaldi's triangular mel filters (20 Hz to
Nyquist, on the mel scale 1127 ln(1 + f / 700)) and the natural log floored at float32's epsilon. No dither: FunASR
dithers only in training, and OASR's features never depend on a random draw.

LFR stacks ``lfr_m`` consecutive fbank frames into one every ``lfr_n`` (7 and 6: 60 ms frames of 560 values),
the first frame repeated ``(lfr_m - 1) // 2`` times before the input and the last one after it, so an input of
F fbank frames gives ceil(F / lfr_n) frames. CMVN adds ``am.mvn``'s shift and multiplies by its scale.

A batch is computed at once on the caller's device, each row from its own samples only; padded frames are zero,
as FunASR's ``pad_sequence`` leaves them. No library does this batched: torchaudio's kaldi module and
kaldi-native-fbank both work a waveform at a time (and torchaudio has no build for OASR's torch).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from oasr.features import FEATURE_EXTRACTORS
from oasr.features.mel import DeviceConstants
from oasr.features.upload import pad_to_device

SAMPLE_SCALE = 1 << 15  # FunASR scales [-1, 1] samples to 16-bit range before Kaldi's fbank
PREEMPHASIS = 0.97
LOW_FREQ = 20.0  # Kaldi's default lowest mel-filter edge, in Hz
LOG_FLOOR = float(np.finfo(np.float32).eps)  # Kaldi floors the mel energies at float epsilon before the log
WINDOWS = ("hamming", "povey", "hanning", "rectangular")
WINDOW_SECONDS = 60  # the longest request the frame-synchronous runner hands a model


@dataclass(frozen=True)
class FunasrFbankConfig:
    sample_rate: int = 16_000
    num_mel_bins: int = 80
    frame_length_ms: float = 25.0
    frame_shift_ms: float = 10.0
    window: str = "hamming"
    lfr_m: int = 7  # fbank frames stacked into one output frame
    lfr_n: int = 6  # fbank frames between two output frames
    # am.mvn: added to each stacked frame, then multiplied (lfr_m * num_mel_bins values each); empty: no CMVN.
    cmvn_shift: tuple[float, ...] = field(default=(), repr=False)
    cmvn_scale: tuple[float, ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        if self.window not in WINDOWS:
            raise ValueError(f"unknown fbank window {self.window!r}; known: {', '.join(WINDOWS)}")
        if self.lfr_m < 1 or self.lfr_n < 1:
            raise ValueError(f"lfr_m and lfr_n must be positive; got {self.lfr_m}, {self.lfr_n}")
        if len(self.cmvn_shift) != len(self.cmvn_scale):
            raise ValueError(f"am.mvn has {len(self.cmvn_shift)} shifts but {len(self.cmvn_scale)} scales")
        if self.cmvn_shift and len(self.cmvn_shift) < self.feature_size:
            raise ValueError(f"am.mvn holds {len(self.cmvn_shift)} values; the frames have {self.feature_size}")

    @property
    def win_length(self) -> int:
        return int(self.sample_rate * self.frame_length_ms / 1000)

    @property
    def hop_length(self) -> int:
        """Samples between two fbank frames (the engine's frame count per sample is read from this)."""
        return int(self.sample_rate * self.frame_shift_ms / 1000)

    @property
    def n_fft(self) -> int:
        return 1 << (self.win_length - 1).bit_length()  # Kaldi rounds the window up to a power of two

    @property
    def feature_size(self) -> int:
        return self.num_mel_bins * self.lfr_m

    @property
    def n_samples(self) -> int:
        return WINDOW_SECONDS * self.sample_rate

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> FunasrFbankConfig:
        """From FunASR's ``frontend_conf`` (``fs``, ``n_mels``, ``frame_length``, ...) plus the CMVN arrays."""
        return cls(sample_rate=int(values.get("fs", 16_000)), num_mel_bins=int(values.get("n_mels", 80)),
                   frame_length_ms=float(values.get("frame_length", 25)),
                   frame_shift_ms=float(values.get("frame_shift", 10)), window=str(values.get("window", "hamming")),
                   lfr_m=int(values.get("lfr_m", 1)), lfr_n=int(values.get("lfr_n", 1)),
                   cmvn_shift=tuple(values.get("cmvn_shift", ())), cmvn_scale=tuple(values.get("cmvn_scale", ())))


def kaldi_window(kind: str, length: int) -> np.ndarray:
    """Kaldi's analysis windows (``feature-window.cc``), float64 [length]."""
    n = np.arange(length, dtype=np.float64)
    a = 2 * math.pi / (length - 1)
    if kind == "hamming":
        return 0.54 - 0.46 * np.cos(a * n)
    if kind == "hanning":
        return 0.5 - 0.5 * np.cos(a * n)
    if kind == "povey":
        return (0.5 - 0.5 * np.cos(a * n)) ** 0.85
    return np.ones(length)


def kaldi_mel_banks(num_bins: int, n_fft: int, sample_rate: int) -> np.ndarray:
    """Kaldi's triangular filters (``mel-computations.cc``) over the FFT's n_fft // 2 + 1 bins (the Nyquist bin
    weighs zero, as in torchaudio), float64 [num_bins, n_fft // 2 + 1]."""
    def mel(freq: np.ndarray | float) -> np.ndarray:
        return 1127.0 * np.log(1.0 + np.asarray(freq, dtype=np.float64) / 700.0)

    low, high = mel(LOW_FREQ), mel(sample_rate / 2)
    delta = (high - low) / (num_bins + 1)
    bins = mel(np.arange(n_fft // 2) * sample_rate / n_fft)  # [n_fft // 2]
    left = low + delta * np.arange(num_bins)[:, None]
    center, right = left + delta, left + 2 * delta
    rising = (bins - left) / (center - left)
    falling = (right - bins) / (right - center)
    weights = np.where(bins <= center, rising, falling)
    weights = np.where((bins > left) & (bins < right), weights, 0.0)
    return np.concatenate([weights, np.zeros((num_bins, 1))], axis=1)


@FEATURE_EXTRACTORS.register("funasr_fbank")
class FunasrFbank:
    """Audio of any lengths -> (features [B, T, lfr_m * num_mel_bins], lengths [B]); T: the longest row's."""

    def __init__(self, config: FunasrFbankConfig | None = None) -> None:
        self.config = config or FunasrFbankConfig()
        c = self.config
        cmvn = (torch.tensor([c.cmvn_shift, c.cmvn_scale], dtype=torch.float32)[:, : c.feature_size]
                if c.cmvn_shift else torch.tensor([[0.0], [1.0]]))
        self._constants = DeviceConstants(
            window=torch.from_numpy(kaldi_window(c.window, c.win_length)).float(),
            banks=torch.from_numpy(kaldi_mel_banks(c.num_mel_bins, c.n_fft, c.sample_rate)).float().T.contiguous(),
            cmvn=cmvn,
        )

    @classmethod
    def for_model(cls, config: object) -> FunasrFbank:
        """The frontend a FunASR checkpoint's config names (``frontend`` holds its ``FunasrFbankConfig``)."""
        return cls(config.frontend)  # type: ignore[attr-defined]

    def fbank_lengths(self, num_samples: torch.Tensor) -> torch.Tensor:
        """Samples [B] -> Kaldi fbank frames [B] (frames wholly inside the input)."""
        c = self.config
        frames = torch.div(num_samples - c.win_length, c.hop_length, rounding_mode="floor") + 1
        return frames.clamp(min=0)

    def frame_lengths(self, num_samples: torch.Tensor) -> torch.Tensor:
        """Samples [B] -> output (LFR) frames [B]: ceil(fbank frames / lfr_n)."""
        return torch.div(self.fbank_lengths(num_samples) + self.config.lfr_n - 1, self.config.lfr_n,
                         rounding_mode="floor")

    def __call__(self, audio: Sequence[np.ndarray | torch.Tensor], device: torch.device | str = "cpu"
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """audio: 1-D 16 kHz float arrays -> (features [B, T, feature_size], lengths [B] on ``device``)."""
        waveforms, num_samples = pad_to_device(list(audio), device)
        return self.extract(waveforms, num_samples)

    def padded(self, audio: Sequence[np.ndarray | torch.Tensor], device: torch.device | str = "cpu") -> torch.Tensor:
        """Features [B, T, feature_size], zero past each row's frames (``frame_lengths`` gives them)."""
        return self(audio, device)[0]

    def extract(self, waveforms: torch.Tensor, num_samples: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """waveforms: float32 [B, N] zero-padded; num_samples: [B] -> (features [B, T, feature_size], [B])."""
        fbank_lengths = self.fbank_lengths(num_samples)
        fbank = self.fbank(waveforms, int(fbank_lengths.max()) if len(fbank_lengths) else 0)
        lengths = self.frame_lengths(num_samples)
        # At least one (zero) frame wide: a batch of inputs all under 25 ms has no frames, and the encoder's
        # convolutions need one to run on; the rows' lengths stay 0 and the models drop them.
        stacked = self.stack(fbank, fbank_lengths, max(int(lengths.max()), 1) if len(lengths) else 0)
        cmvn = self._constants.on(waveforms.device)["cmvn"]
        features = (stacked + cmvn[0]) * cmvn[1]
        inside = torch.arange(features.shape[1], device=features.device)[None, :] < lengths[:, None]
        return features * inside[:, :, None], lengths

    def fbank(self, waveforms: torch.Tensor, num_frames: int) -> torch.Tensor:
        """float32 [B, N] -> log-mel [B, num_frames, num_mel_bins] (rows past their own frames hold garbage that
        ``stack`` never reads)."""
        c = self.config
        constants = self._constants.on(waveforms.device)
        if num_frames == 0:
            return waveforms.new_zeros(waveforms.shape[0], 0, c.num_mel_bins)
        needed = (num_frames - 1) * c.hop_length + c.win_length
        frames = (waveforms[:, :needed] * SAMPLE_SCALE).unfold(1, c.win_length, c.hop_length)  # [B, F, W]
        frames = frames - frames.mean(dim=2, keepdim=True)
        previous = torch.cat([frames[:, :, :1], frames[:, :, :-1]], dim=2)
        frames = (frames - PREEMPHASIS * previous) * constants["window"]
        spectrum = torch.fft.rfft(frames, n=c.n_fft)
        power = spectrum.real.square() + spectrum.imag.square()
        return torch.log((power @ constants["banks"]).clamp(min=LOG_FLOOR))

    def stack(self, fbank: torch.Tensor, fbank_lengths: torch.Tensor, num_frames: int) -> torch.Tensor:
        """LFR: [B, F, n_mels] -> [B, num_frames, lfr_m * n_mels], each row's edge frames repeated at its ends."""
        c = self.config
        if c.lfr_m == 1 and c.lfr_n == 1:
            return fbank[:, :num_frames]
        batch = fbank.shape[0]
        offsets = torch.arange(num_frames, device=fbank.device)[:, None] * c.lfr_n
        taps = offsets + torch.arange(c.lfr_m, device=fbank.device)[None, :] - (c.lfr_m - 1) // 2  # [T, m]
        last = (fbank_lengths.to(fbank.device) - 1).clamp(min=0)[:, None, None]
        index = torch.minimum(taps.clamp(min=0)[None].expand(batch, -1, -1), last)  # [B, T, m]
        if fbank.shape[1] == 0:
            return fbank.new_zeros(batch, num_frames, c.feature_size)
        gathered = torch.gather(fbank, 1, index.reshape(batch, -1, 1).expand(-1, -1, fbank.shape[2]))
        return gathered.reshape(batch, num_frames, c.feature_size)
