"""What every VAD detector offers, and the chunking they share."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch

Audio = np.ndarray | torch.Tensor


class SpeechDetector(Protocol):
    """16 kHz mono audio -> per-chunk speech probabilities in [0, 1]."""

    sample_rate: int
    chunk_samples: int
    model_folder: str  # "none", "optional" or "required": whether ``load`` takes a ``model_dir`` (oasr.vad)
    # True: ``segments(audio) -> [[start_ms, end_ms], ...]`` are the detector's own speech segments, which the
    # window planner cuts at; False: OASR's segmenter finds them in ``speech_probs``.
    cuts_own_segments: bool

    def speech_probs(self, audios: Sequence[Audio]) -> list[np.ndarray]:
        """One float32 array per input, ``num_chunks(len(audio), chunk_samples)`` long, all inputs in one batch."""
        ...


def num_chunks(num_samples: int, chunk_samples: int) -> int:
    return -(-num_samples // chunk_samples)


def as_samples(audio: Audio) -> torch.Tensor:
    """A 1-D float32 CPU tensor of the samples (numpy arrays are shared, not copied)."""
    samples = torch.as_tensor(audio).detach().reshape(-1)
    return samples.to(device="cpu", dtype=torch.float32)


def chunk_rows(rows: Sequence[torch.Tensor], chunk_samples: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Zero-pad 1-D sample rows to whole chunks and stack them -> chunks [R, T, chunk_samples], lengths [R]."""
    lengths = torch.tensor([num_chunks(len(r), chunk_samples) for r in rows], dtype=torch.long)
    width = int(lengths.max()) if len(rows) else 0
    out = torch.zeros(len(rows), width * chunk_samples)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out.reshape(len(rows), width, chunk_samples), lengths
