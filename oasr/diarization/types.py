"""What diarization hands back, torch-free (the server's API processes read it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SpeakerSegment:
    """A stretch where one speaker talks. ``speaker``: 0-based, in order of first arrival; segments of different
    speakers may overlap."""

    start: float  # seconds from the input's start
    end: float
    speaker: int

    @property
    def label(self) -> str:
        return f"speaker_{self.speaker}"


@dataclass(frozen=True)
class Diarization:
    source: str
    duration: float  # seconds of audio
    segments: tuple[SpeakerSegment, ...]

    @property
    def num_speakers(self) -> int:
        return len({s.speaker for s in self.segments})
