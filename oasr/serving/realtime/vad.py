"""Speech probabilities of a session's audio as it arrives, from a VAD detector of ``oasr.vad``'s registry.

The detector is loaded once per server, on the first session that turns server VAD on (it imports torch, which an
HTTP worker in process mode otherwise never loads). Each session scores its audio through a ``StreamScorer``:
whole chunks as they complete, continuing the detector's recurrent state, so the probabilities equal one pass
over the whole stream. Only detectors with a streaming ``step`` (Silero) qualify; the energy detector measures a
stream against its own quiet parts, which a live stream does not have yet.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np


class UnavailableVADError(RuntimeError):
    """The configured detector cannot be loaded here (its package is not installed) or cannot stream."""


class DetectorHandle:
    """The server's one detector, loaded on first use (thread-safe: sessions load it from worker threads)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._detector: Any = None
        self._lock = threading.Lock()

    def get(self) -> Any:
        with self._lock:
            if self._detector is None:
                from oasr.vad import load_detector
                from oasr.vad.silero_checkpoint import MissingVADPackageError

                try:
                    detector = load_detector(self.name, "cpu")
                except (ImportError, FileNotFoundError, MissingVADPackageError) as exc:
                    raise UnavailableVADError(f"the {self.name} VAD is not available on this server: {exc}") from None
                if not hasattr(detector, "step"):
                    raise UnavailableVADError(f"the {self.name} VAD cannot score a live stream")
                self._detector = detector
            return self._detector

    def stream(self) -> StreamScorer:
        return StreamScorer(self.get())


class StreamScorer:
    """One stream's probabilities, chunk by chunk. ``push`` runs the network: call it off the event loop."""

    def __init__(self, detector: Any) -> None:
        from oasr.vad.silero_net import SileroState

        self._detector = detector
        self.chunk_samples: int = detector.chunk_samples
        self._state = SileroState.initial(1)
        self._pending = np.zeros(0, dtype=np.float32)

    def push(self, samples: np.ndarray) -> np.ndarray:
        """Probabilities of the chunks ``samples`` completes (maybe none)."""
        import torch

        audio = np.concatenate([self._pending, np.asarray(samples, dtype=np.float32)])
        num_chunks = len(audio) // self.chunk_samples
        self._pending = audio[num_chunks * self.chunk_samples :]
        if num_chunks == 0:
            return np.zeros(0, dtype=np.float32)
        chunks = torch.from_numpy(audio[: num_chunks * self.chunk_samples].copy()).reshape(1, num_chunks, -1)
        probs, self._state = self._detector.step(chunks, self._state)
        return probs[0].float().numpy()
