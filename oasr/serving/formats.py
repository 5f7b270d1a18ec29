"""Rendering results as txt, json, jsonl, srt and vtt (shared by the CLI and, later, the HTTP server)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from oasr.types import Transcription

OUTPUT_FORMATS = ("txt", "json", "jsonl", "srt", "vtt")


def clock(seconds: float, decimal: str) -> str:
    millis = round(seconds * 1000)
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{decimal}{millis:03d}"


def to_srt(result: Transcription) -> str:
    cues = [
        f"{i}\n{clock(s.start, ',')} --> {clock(s.end, ',')}\n{s.text}\n"
        for i, s in enumerate(result.segments, start=1)
    ]
    return "\n".join(cues)


def to_vtt(result: Transcription) -> str:
    cues = [f"{clock(s.start, '.')} --> {clock(s.end, '.')}\n{s.text}\n" for s in result.segments]
    return "WEBVTT\n\n" + "\n".join(cues)


def render(result: Transcription, fmt: str) -> str:
    """One result in one format (``json`` and ``jsonl`` give the same object, the latter on one line)."""
    if fmt == "txt":
        return result.text + "\n"
    if fmt == "json":
        return json.dumps(result.to_dict(), ensure_ascii=False, indent=2) + "\n"
    if fmt == "jsonl":
        return json.dumps(result.to_dict(), ensure_ascii=False) + "\n"
    if fmt == "srt":
        return to_srt(result)
    if fmt == "vtt":
        return to_vtt(result)
    raise ValueError(f"unknown output format {fmt!r}; choose one of {', '.join(OUTPUT_FORMATS)}")


def render_many(results: Sequence[Transcription], fmt: str) -> str:
    """Several results for one stream (stdout): a JSON array for ``json``, concatenation otherwise."""
    if fmt == "json":
        return json.dumps([r.to_dict() for r in results], ensure_ascii=False, indent=2) + "\n"
    return "".join(render(r, fmt) for r in results)
