"""The ``silero`` detector: Silero VAD's 16 kHz network with weights from the ``silero-vad`` package.

Many streams are scored in one batch. A long stream can also be scored as several pieces side by side
(``SileroOptions.piece_s``): each piece starts from a fresh LSTM state a little early (``warmup_s``) and drops
those warm-up chunks, which turns one long recurrence into a short, wide one (the GPU's way to go fast). The
probabilities then differ slightly from one unbroken pass; ``piece_s=None`` keeps the exact recurrence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from oasr.vad import VAD_DETECTORS
from oasr.vad.detector import Audio, as_samples, chunk_rows, num_chunks
from oasr.vad.silero_checkpoint import SileroWeights, load_net
from oasr.vad.silero_net import CHUNK_SAMPLES, CONTEXT_SAMPLES, SAMPLE_RATE, SileroState, SileroVADNet


@dataclass(frozen=True)
class SileroOptions:
    weights: SileroWeights = "jit"  # which of the package's checkpoints (see oasr.vad.silero_checkpoint)
    piece_s: float | None = None  # score streams longer than this as pieces side by side; None: one pass
    warmup_s: float = 4.0  # chunks each piece runs before its own start, to settle the LSTM state
    max_chunks_per_pass: int = 16_384  # bounds the front's memory (about 2.6 MB per 1,000 chunks)

    def __post_init__(self) -> None:
        if self.piece_s is not None and self.piece_s * SAMPLE_RATE < CHUNK_SAMPLES:
            raise ValueError(f"piece_s must cover at least one {CHUNK_SAMPLES}-sample chunk, got {self.piece_s}")
        if self.warmup_s < 0:
            raise ValueError(f"warmup_s must be >= 0, got {self.warmup_s}")
        if self.max_chunks_per_pass < 1:
            raise ValueError(f"max_chunks_per_pass must be >= 1, got {self.max_chunks_per_pass}")


@VAD_DETECTORS.register("silero")
class SileroVAD:
    sample_rate = SAMPLE_RATE
    chunk_samples = CHUNK_SAMPLES
    model_folder = "none"  # its weights come with the code (oasr.vad's detector specs)
    cuts_own_segments = False  # the segmenter cuts at its probabilities

    def __init__(self, net: SileroVADNet, device: str | torch.device = "cpu", options: SileroOptions | None = None):
        self.device = torch.device(device)
        self.net = net.to(self.device)
        self.options = options or SileroOptions()

    @classmethod
    def load(cls, device: str | torch.device = "cpu", options: SileroOptions | None = None) -> SileroVAD:
        options = options or SileroOptions()
        return cls(load_net(options.weights), device, options)

    @torch.inference_mode()
    def step(
        self, chunks: torch.Tensor, state: SileroState, lengths: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, SileroState]:
        """Streaming: chunks [B, T, 512] continuing ``state`` -> probabilities [B, T] and the next state."""
        return self.net(chunks, state, lengths, self.options.max_chunks_per_pass)

    def open_stream(self) -> SileroStream:
        """A live stream's probabilities, chunk by chunk (``oasr.vad.stream``)."""
        return SileroStream(self)

    @torch.inference_mode()
    def speech_probs(self, audios: Sequence[Audio]) -> list[np.ndarray]:
        samples = [as_samples(a) for a in audios]
        pieces = [self._pieces(s) for s in samples]
        rows = [row for stream in pieces for row, _, _ in stream]
        contexts = [ctx for stream in pieces for _, ctx, _ in stream]
        if not rows:  # no input, or only empty ones
            return [np.zeros(0, dtype=np.float32) for _ in audios]
        chunks, lengths = chunk_rows(rows, CHUNK_SAMPLES)
        state = SileroState.initial(len(rows), self.device)
        state = SileroState(torch.stack(contexts).to(self.device), state.h, state.c)
        probs, _ = self.step(chunks.to(self.device), state, lengths)
        probs = probs.float().cpu().numpy()
        out, r = [], 0
        for stream in pieces:
            parts = [probs[r + i, skip : int(lengths[r + i])] for i, (_, _, skip) in enumerate(stream)]
            out.append(np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32))
            r += len(stream)
        return out

    def _pieces(self, samples: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor, int]]:
        """Rows to score for one stream: (samples, the 64 samples before them, warm-up chunks to drop)."""
        total = num_chunks(len(samples), CHUNK_SAMPLES)
        piece_s = self.options.piece_s
        if total == 0:
            return []
        if piece_s is None or total * CHUNK_SAMPLES <= piece_s * SAMPLE_RATE:
            return [(samples, torch.zeros(CONTEXT_SAMPLES), 0)]
        piece = max(1, int(piece_s * SAMPLE_RATE) // CHUNK_SAMPLES)
        warmup = int(self.options.warmup_s * SAMPLE_RATE) // CHUNK_SAMPLES
        out = []
        for first in range(0, total, piece):
            begin = max(0, first - warmup)
            start = begin * CHUNK_SAMPLES
            context = samples[max(0, start - CONTEXT_SAMPLES) : start]
            context = torch.cat([torch.zeros(CONTEXT_SAMPLES - len(context)), context])
            out.append((samples[start : (first + piece) * CHUNK_SAMPLES], context, first - begin))
        return out


class SileroStream:
    """One live stream: whole chunks scored as they complete, the LSTM state carried from push to push, so the
    probabilities equal one pass over the whole stream."""

    def __init__(self, detector: SileroVAD) -> None:
        self._detector = detector
        self._state = SileroState.initial(1, detector.device)
        self._pending = np.zeros(0, dtype=np.float32)

    def push(self, samples: np.ndarray) -> np.ndarray:
        """Probabilities of the chunks ``samples`` completes (maybe none)."""
        audio = np.concatenate([self._pending, np.asarray(samples, dtype=np.float32)])
        num_whole = len(audio) // CHUNK_SAMPLES
        self._pending = audio[num_whole * CHUNK_SAMPLES :]
        if num_whole == 0:
            return np.zeros(0, dtype=np.float32)
        chunks = torch.from_numpy(audio[: num_whole * CHUNK_SAMPLES].copy()).reshape(1, num_whole, -1)
        probs, self._state = self._detector.step(chunks.to(self._detector.device), self._state)
        return probs[0].float().cpu().numpy()
