"""The shared labelled speech set (../shared/data/speech next to the repo, or $OASR_SPEECH_DATA)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from oasr.audio import load_audio


def speech_data_dir() -> Path:
    override = os.environ.get("OASR_SPEECH_DATA")
    if override:
        return Path(override)
    return Path(__file__).resolve().parents[1].parent / "shared/data/speech"


def manifest_entries() -> list[dict[str, Any]]:
    manifest = speech_data_dir() / "manifest.jsonl"
    if not manifest.is_file():
        return []
    with manifest.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def audio_path(entry: dict[str, Any]) -> Path:
    return speech_data_dir() / entry["audio"]


def require_speech_data() -> list[dict[str, Any]]:
    entries = manifest_entries()
    if not entries:
        pytest.skip(f"shared speech data not found under {speech_data_dir()} (set OASR_SPEECH_DATA)")
    return entries


def english_short(max_seconds: float = 30.0) -> list[dict[str, Any]]:
    """Every English clip whose audio fits Whisper's single 30 s window."""
    return [e for e in manifest_entries() if e["language"] == "en" and e["duration_s"] <= max_seconds]


@dataclass(frozen=True)
class Clip:
    id: str
    language: str
    text: str
    audio: np.ndarray


def clips(ids=None, *, languages=None) -> list[Clip]:
    require_speech_data()
    entries = manifest_entries()
    if ids is not None:
        by_id = {e["id"]: e for e in entries}
        entries = [by_id[i] for i in ids]
    if languages is not None:
        entries = [e for e in entries if e["language"] in languages]
    return [Clip(e["id"], e["language"], e["text"], load_audio(audio_path(e), channel=e.get("channel")))
            for e in entries]
