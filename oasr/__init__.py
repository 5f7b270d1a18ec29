"""OASR: an inference and serving engine for speech recognition."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["Transcription", "TranscribeOptions", "from_pretrained", "iter_transcribe", "transcribe"]

if TYPE_CHECKING:
    from oasr.api import from_pretrained, iter_transcribe, transcribe
    from oasr.types import TranscribeOptions, Transcription

# Importing torch and the models costs seconds; ``import oasr`` stays cheap until one of these is used.
_LAZY = {
    "transcribe": "oasr.api",
    "iter_transcribe": "oasr.api",
    "from_pretrained": "oasr.api",
    "Transcription": "oasr.types",
    "TranscribeOptions": "oasr.types",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'oasr' has no attribute {name!r}")
