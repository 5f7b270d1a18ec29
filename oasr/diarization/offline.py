"""Whole inputs -> ``Diarization`` results: features and the chunked forward in batches of similar lengths."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from oasr.diarization.loader import LoadedDiarizer
from oasr.diarization.segments import speaker_segments
from oasr.diarization.types import Diarization

SAMPLE_RATE = 16000


class OfflineDiarizer:
    """Batches inputs by length (a row's result never depends on its batch, so this only saves padding).

    A batch holds up to ``max_batch_seconds`` of padded audio. The forward walks a file chunk by chunk (each step
    re-reads the speaker cache and FIFO), so a batch's steps run one after another and only its rows run side by
    side: at 600 s a batch of 2-minute files was 5 rows, and 1,000 such files took 2.2x the ASR's own time on an
    H100. Two hours of audio a batch (60 such rows) still needs well under a GiB for a step's activations at the
    release shape."""

    def __init__(self, loaded: LoadedDiarizer, max_batch_seconds: float = 7200.0, threshold: float = 0.5) -> None:
        if not 0.0 < threshold < 1.0:
            raise ValueError(f"threshold must lie in (0, 1), got {threshold}")
        self.loaded, self.max_batch_seconds, self.threshold = loaded, max_batch_seconds, threshold

    def batches(self, lengths: Sequence[int]) -> list[list[int]]:
        """Inputs of ``lengths`` samples -> their indices in batches, shortest first: a batch is cut before the
        row that would take its padded audio (rows x its longest) past ``max_batch_seconds``."""
        batches: list[list[int]] = [[]]
        for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
            batch = batches[-1]
            if batch and lengths[i] * (len(batch) + 1) > self.max_batch_seconds * SAMPLE_RATE:
                batches.append(batch := [])
            batch.append(i)
        return batches if batches[0] else []

    @torch.inference_mode()
    def run(self, audio: Sequence[np.ndarray]) -> list[np.ndarray]:
        """One batch of 16 kHz float inputs -> each input's speaker probabilities [its mel frames, speakers]."""
        loaded = self.loaded
        features, lengths = loaded.features(list(audio), loaded.device)
        logits = loaded.model.diarize(features.transpose(1, 2), lengths)
        probs = logits.float().sigmoid().cpu().numpy()
        return [probs[j, : int(length)] for j, length in enumerate(lengths)]

    def probabilities(self, audio: Sequence[np.ndarray]) -> list[np.ndarray]:
        """16 kHz float inputs -> each input's speaker probabilities [its mel frames, speakers] (float32)."""
        out: list[np.ndarray | None] = [None] * len(audio)
        for rows in self.batches([len(a) for a in audio]):
            for i, probs in zip(rows, self.run([audio[i] for i in rows]), strict=True):
                out[i] = probs
        return out  # type: ignore[return-value]

    def diarize(self, audio: Sequence[np.ndarray], sources: Sequence[str] | None = None) -> list[Diarization]:
        sources = sources or [f"input {i}" for i in range(len(audio))]
        results = []
        for source, samples, probs in zip(sources, audio, self.probabilities(audio)):
            segments = speaker_segments(probs, self.loaded.frame_seconds, self.threshold)
            results.append(Diarization(source, len(samples) / SAMPLE_RATE, segments))
        return results
