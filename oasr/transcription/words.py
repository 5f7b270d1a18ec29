"""Word timestamps for windows the engine has decoded, as a second pass beside the step loop.

A window's words need its tokens, which are known only once it finishes, and its encoder output, which the
engine frees at that moment; so the windows' audio is encoded again and aligned (the word aligner the capability
record names, ``oasr.models.aligners``; Whisper's: alignment heads, median filter, DTW), all windows of one input in one call, each
window's first word placed after where speech ended in the window before it. ``oasr.transcribe(word_timestamps=True)`` does
the same in parallel long-form mode, so the server's words equal offline ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from oasr.errors import UnsupportedOptionError
from oasr.models.aligners import WORD_ALIGNERS
from oasr.models.base import AlignmentRow
from oasr.models.capabilities import capabilities_of
from oasr.transcription.results import DecodedWindow
from oasr.types import Task, Word

if TYPE_CHECKING:
    from oasr.models.loader import LoadedModel

HOP_LENGTH = 160  # samples per feature frame (10 ms at 16 kHz)


def frames_of(num_samples: int, max_frames: int) -> int:
    """Feature frames holding ``num_samples`` of 16 kHz audio, capped at one window."""
    return min(num_samples // HOP_LENGTH, max_frames)


def supports_word_timestamps(loaded: LoadedModel) -> bool:
    """Whether the architecture declares word timing in its capabilities (Whisper: every checkpoint, with its
    alignment heads or openai-whisper's default heads)."""
    return capabilities_of(type(loaded.model)).word_timing


def alignment_rows(windows: Sequence[DecodedWindow], audio: Sequence[np.ndarray], task: Task,
                   window_samples: int) -> list[AlignmentRow]:
    """One row per decoded window of one input, in order; ``audio`` holds each window's samples."""
    max_frames = window_samples // HOP_LENGTH
    return [
        AlignmentRow(tuple(w.token_ids), frames_of(len(samples), max_frames), language=w.language, task=task,
                     time_offset=w.start_s, last_speech_end=0.0 if i == 0 else None)
        for i, (w, samples) in enumerate(zip(windows, audio, strict=True))
    ]


def align_windows(loaded: LoadedModel, rows: Sequence[AlignmentRow], audio: Sequence[np.ndarray]) -> list[list[Word]]:
    """The words of each row (times from the input's start), from the rows' audio (16 kHz, one window each)."""
    if not supports_word_timestamps(loaded):
        raise UnsupportedOptionError(f"{loaded.name} ({loaded.architecture}) cannot give word timestamps")
    if len(rows) != len(audio):
        raise ValueError(f"{len(rows)} rows but {len(audio)} windows of audio")
    if not rows:
        return []
    features = loaded.features.padded(list(audio), device=loaded.device)
    return WORD_ALIGNERS.get(capabilities_of(type(loaded.model)).aligner).align_words(loaded, rows, features)
