"""The ``energy`` detector: speech where a chunk is loud compared with the stream's own quiet parts.

No weights and no state beyond one stream: for each 512-sample chunk, its level in dBFS (RMS); the stream's noise
floor is a low percentile of those levels. A chunk's "probability" is a logistic of how far its level sits above
``max(floor + margin_db, min_level_db)``. It suits clean audio with real pauses; noise that comes and goes
(music, traffic) counts as speech, which is what ``silero`` is for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from oasr.vad import VAD_DETECTORS
from oasr.vad.detector import Audio, as_samples, chunk_rows

SAMPLE_RATE = 16_000
CHUNK_SAMPLES = 512
_SILENT_DB = -120.0  # level given to digital silence instead of -inf


@dataclass(frozen=True)
class EnergyOptions:
    floor_percentile: float = 10.0  # percentile of chunk levels taken as the noise floor
    margin_db: float = 15.0  # speech sits this far above the floor ...
    min_level_db: float = -55.0  # ... and above this level whatever the floor
    slope_db: float = 2.0  # logistic width: 2 dB above the threshold is p = 0.73

    def __post_init__(self) -> None:
        if not 0 <= self.floor_percentile <= 100:
            raise ValueError(f"floor_percentile must be in [0, 100], got {self.floor_percentile}")
        if self.slope_db <= 0:
            raise ValueError(f"slope_db must be > 0, got {self.slope_db}")


@VAD_DETECTORS.register("energy")
class EnergyVAD:
    sample_rate = SAMPLE_RATE
    chunk_samples = CHUNK_SAMPLES
    model_folder = "none"  # no weights (oasr.vad's detector specs)
    cuts_own_segments = False  # the segmenter cuts at its probabilities

    def __init__(self, device: str | torch.device = "cpu", options: EnergyOptions | None = None) -> None:
        self.device = torch.device(device)
        self.options = options or EnergyOptions()

    @classmethod
    def load(cls, device: str | torch.device = "cpu", options: EnergyOptions | None = None) -> EnergyVAD:
        return cls(device, options)

    @torch.inference_mode()
    def speech_probs(self, audios: Sequence[Audio]) -> list[np.ndarray]:
        rows = [as_samples(a) for a in audios]
        if not any(len(r) for r in rows):
            return [np.zeros(0, dtype=np.float32) for _ in rows]
        chunks, lengths = chunk_rows(rows, CHUNK_SAMPLES)
        chunks = chunks.to(self.device)
        power = chunks.square().mean(dim=-1)
        level = 10 * torch.log10(power.clamp_min(10 ** (_SILENT_DB / 10)))  # [B, T] dBFS
        valid = torch.arange(level.shape[1], device=self.device)[None, :] < lengths.to(self.device)[:, None]
        threshold = self._thresholds(level, valid)
        probs = torch.sigmoid((level - threshold[:, None]) / self.options.slope_db).cpu().numpy()
        return [probs[i, : int(n)].astype(np.float32) for i, n in enumerate(lengths)]

    def _thresholds(self, level: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Per stream: the level [B] a chunk must exceed to count as speech."""
        o = self.options
        masked = level.masked_fill(~valid, float("nan"))
        floor = torch.nanquantile(masked, o.floor_percentile / 100, dim=1)
        return (floor + o.margin_db).clamp_min(o.min_level_db)
