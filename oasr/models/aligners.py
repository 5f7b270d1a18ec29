"""Word aligners: how a family times the words of decoded windows, named by its capability record
(``ModelCapabilities.aligner``) and looked up here, so the layers above reach it without importing the family.

The record holds the aligner's name, not the aligner: it travels to the server's API processes, which import no
torch. ``WORD_ALIGNERS`` checks every aligner against ``WordAligner`` when it registers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from oasr.registry import Registry

if TYPE_CHECKING:  # annotations only
    import torch

    from oasr.models.base import AlignmentRow, TextSpan, TimedSegment
    from oasr.types import Word


@runtime_checkable
class WordAligner(Protocol):
    """Times words in two ways: whole rows at once (``align_words``: parallel long-form windows, the server), or
    a window's words first and their placement after (``window_words`` then ``place_words``: the sequential
    driver, which moves its cursor by where the words end)."""

    def align_words(self, loaded: Any, rows: Sequence[AlignmentRow], features: torch.Tensor) -> list[list[Word]]:
        """The words of each row (times from the input's start), from the rows' features [B, n_mels, frames]."""

    def window_words(self, loaded: Any, rows: Sequence[AlignmentRow], features: torch.Tensor) -> list[list[Any]]:
        """Each row's words in window seconds, before any adjustment (what ``place_words`` takes)."""

    def place_words(self, words: list[Any], spans: Sequence[TextSpan], time_offset: float,
                    last_speech_end: float) -> tuple[list[TimedSegment], float]:
        """One window's ``window_words`` adjusted and handed to its spans (times from the input's start) -> the
        spans' segments, and where speech ends after the window."""


WORD_ALIGNERS: Registry[type] = Registry("word aligner", lazy={"whisper": "oasr.models.whisper.alignment",
                                                                 "cif": "oasr.models.paraformer.alignment"},
                                         contract=WordAligner)
