"""The server's VAD detector for realtime sessions, from ``oasr.vad``'s registry, and one stream of it per session.

The detector is loaded once per server, on the first session that turns server VAD on (it imports torch, which an
HTTP worker in process mode otherwise never loads). Each session feeds its audio to a stream of its own
(``oasr.vad.stream``): Silero's gives speech probabilities chunk by chunk, which the session turns into turns with
OpenAI's ``server_vad`` knobs; FSMN-VAD's gives its own segment edges, which become the turns as they are. Any
detector that can open a stream qualifies; the energy detector, which measures a stream against its own quiet
parts, cannot.
"""

from __future__ import annotations

import threading
from typing import Any

from oasr.errors import OASRError
from oasr.vad.stream import DetectorStream as StreamScorer  # what a session pushes its samples to
from oasr.vad.stream import StreamingDetector


class UnavailableVADError(OASRError, RuntimeError):
    """The configured detector cannot be loaded here (its package or model folder is missing) or cannot stream."""


class DetectorHandle:
    """The server's one detector, loaded on first use (thread-safe: sessions load it from worker threads)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._detector: Any = None
        self._lock = threading.Lock()

    def get(self) -> StreamingDetector:
        with self._lock:
            if self._detector is None:
                from oasr.vad import load_detector
                from oasr.vad.silero_checkpoint import MissingVADPackageError

                try:
                    detector = load_detector(self.name, "cpu")
                except (ImportError, FileNotFoundError, MissingVADPackageError, OASRError) as exc:
                    raise UnavailableVADError(f"the {self.name} VAD is not available on this server: {exc}") from None
                if not isinstance(detector, StreamingDetector):
                    raise UnavailableVADError(f"the {self.name} VAD cannot score a live stream")
                self._detector = detector
            return self._detector

    def stream(self) -> StreamScorer:
        detector = self.get()
        try:
            return detector.open_stream()
        except OASRError as exc:  # a folder the detector loads but cannot stream from
            raise UnavailableVADError(f"the {self.name} VAD cannot score a live stream: {exc}") from None


def check_detector(spec: str) -> None:
    """Loads the detector ``spec`` names once, for a server told to use it: one that cannot be loaded or cannot
    stream is refused at startup (``UnavailableVADError``) instead of at every session."""
    DetectorHandle(spec).stream()


__all__ = ["DetectorHandle", "StreamScorer", "UnavailableVADError", "check_detector"]
