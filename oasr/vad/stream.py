"""Detectors that score a live stream: one ``DetectorStream`` per stream, fed 16 kHz samples as they arrive.

What a stream gives back depends on who decides where speech is (the detector's ``cuts_own_segments``):

- a probability stream (Silero): one speech probability per ``chunk_samples`` chunk the samples complete, equal to
  one pass over the whole stream; the caller turns them into speech with its own policy (the realtime session:
  OpenAI's ``server_vad`` knobs through ``oasr.vad.segmenter``);
- a segment stream (FSMN-VAD): the detector's own segment edges (``StreamSegments``), found by its own state machine
  with its own silence rules, which the caller takes as they are.

NumPy only, so the realtime session (no torch in sight) can read the types.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np


@dataclass(frozen=True)
class SpeechEdge:
    """Where speech starts or stops, in samples since the stream opened."""

    starts: bool  # True: speech starts at ``sample``; False: the open speech ends there
    sample: int


@dataclass(frozen=True)
class StreamSegments:
    """What a segment stream found in the samples pushed so far."""

    edges: tuple[SpeechEdge, ...]  # new since the last push, in order, starts and ends alternating
    # No speech will start before this stream sample any more: audio before it is not part of any segment.
    settled: int
    # With speech open: its segment surely goes on to at least this stream sample (its end is not decided before).
    speech_until: int


class DetectorStream(Protocol):
    """One stream's detector state. ``push`` may run a network: call it off the event loop."""

    def push(self, samples: np.ndarray) -> np.ndarray | StreamSegments:
        """A probability stream's float32 probabilities of the chunks ``samples`` completes (maybe none), or a
        segment stream's ``StreamSegments``."""
        ...


@runtime_checkable
class StreamingDetector(Protocol):
    """A detector that can score a live stream (``energy``, which measures a stream against its own quiet parts,
    cannot)."""

    chunk_samples: int
    cuts_own_segments: bool  # True: its streams give ``StreamSegments``; False: probabilities per chunk

    def open_stream(self) -> DetectorStream:
        ...
