"""Speakers on a transcript: each transcript segment gets the speaker whose activity overlaps it most, and the
result in OpenAI's ``diarized_json`` shape (``{"task", "duration", "text", "segments": [{"type":
"transcript.text.segment", "id", "start", "end", "text", "speaker"}]}``, speakers lettered A, B, ... in order
of first arrival, as OpenAI letters them when no speaker is named)."""

from __future__ import annotations

import json
import string
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from oasr.diarization.types import SpeakerSegment
from oasr.types import Transcription


def speaker_of(start: float, end: float, activity: Sequence[SpeakerSegment]) -> int | None:
    """The speaker talking longest within [start, end); ties go to the earlier arrival. A span nobody talks in
    takes the speaker of the nearest activity (None when there is none at all)."""
    overlap: dict[int, float] = {}
    for seg in activity:
        shared = min(end, seg.end) - max(start, seg.start)
        if shared > 0:
            overlap[seg.speaker] = overlap.get(seg.speaker, 0.0) + shared
    if overlap:
        return min(overlap, key=lambda speaker: (-overlap[speaker], speaker))
    if not activity:
        return None
    nearest = min(activity, key=lambda seg: (max(seg.start - end, start - seg.end), seg.speaker))
    return nearest.speaker


def speaker_letter(speaker: int | None) -> str:
    """0 -> "A", 25 -> "Z", 26 -> "AA"; None (no speech found anywhere) -> "A"."""
    index, letters = speaker or 0, ""
    while True:
        index, rest = divmod(index, 26)
        letters = string.ascii_uppercase[rest] + letters
        if index == 0:
            return letters
        index -= 1


def diarized_json(result: Transcription, activity: Sequence[SpeakerSegment]) -> dict[str, Any]:
    segments = [{"type": "transcript.text.segment", "id": f"seg_{i}", "start": s.start, "end": s.end,
                 "text": s.text, "speaker": speaker_letter(speaker_of(s.start, s.end, activity))}
                for i, s in enumerate(result.segments)]
    return {"task": "transcribe", "duration": result.duration_s, "text": result.text, "segments": segments}


@dataclass(frozen=True)
class DiarizedTranscription:
    """A transcript with the speaker activity of the same input (what ``--output-format diarized_json``
    writes)."""

    transcription: Transcription
    activity: tuple[SpeakerSegment, ...]

    @property
    def error(self) -> str | None:
        return self.transcription.error

    @property
    def source(self) -> str:
        return self.transcription.source

    def render(self) -> str:
        return json.dumps(diarized_json(self.transcription, self.activity), ensure_ascii=False, indent=2) + "\n"
