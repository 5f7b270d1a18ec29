"""RTTM, the line format diarization scorers (md-eval, dscore, pyannote.metrics) read: one line per segment,
``SPEAKER <file> 1 <start> <duration> <NA> <NA> <speaker> <NA> <NA>``, times in seconds."""

from __future__ import annotations

import re

from oasr.diarization.types import Diarization


def recording_id(source: str) -> str:
    """A file's RTTM id: its name without directories or extension, with no whitespace (fields split on it)."""
    name = re.split(r"[\\/]", source)[-1]
    stem = name.rsplit(".", 1)[0] if "." in name.lstrip(".") else name
    return re.sub(r"\s+", "_", stem) or "audio"


def rttm_lines(result: Diarization, file_id: str | None = None) -> list[str]:
    file_id = file_id or recording_id(result.source)
    return [f"SPEAKER {file_id} 1 {s.start:.3f} {s.end - s.start:.3f} <NA> <NA> {s.label} <NA> <NA>"
            for s in result.segments]
