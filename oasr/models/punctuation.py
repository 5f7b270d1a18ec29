"""Punctuators: models that punctuate a transcript's text after decoding (FunASR's CT-Transformer), for ASR models
that write none. A punctuator is named in ``PUNCTUATORS`` and looked up here, so the layers above load one from a
folder without importing its package; each is checked against ``Punctuator`` when it registers.

What a punctuator returns (``PunctuatedText``) says, for each non-space character of its input, how it is
written (capitals), whether a space goes before it and which punctuation follows it. That is enough to write the
whole text as the punctuator does and to restyle any run of the input's characters (a segment's text, one word)
the same way, so words keep their times (``oasr.transcription.punctuation``).

This module imports no torch: the server's HTTP workers read it to check a folder before anything loads.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from oasr.registry import Registry


@dataclass(frozen=True)
class PunctuatedText:
    """A text as a punctuator writes it, character by character of its input's non-space characters."""

    letters: str  # the input's non-space characters, as written (a sentence's first word capitalised)
    spaced: tuple[bool, ...]  # per letter: a space is written before it
    marks: tuple[str, ...]  # per letter: the punctuation written after it ("" for none)

    def __post_init__(self) -> None:
        if not len(self.letters) == len(self.spaced) == len(self.marks):
            raise ValueError(f"letters, spaced and marks differ in length: {len(self.letters)}, "
                             f"{len(self.spaced)}, {len(self.marks)}")

    @property
    def text(self) -> str:
        """The whole text as the punctuator writes it (a leading space where its first word takes one)."""
        return "".join((" " if space else "") + letter + mark
                       for letter, space, mark in zip(self.letters, self.spaced, self.marks))


@runtime_checkable
class Punctuator(Protocol):
    """A loaded punctuation model. ``load`` reads a model folder (a bad folder raises ``CheckpointError`` naming
    what is wrong); ``punctuate`` writes each text of a batch with punctuation."""

    @classmethod
    def load(cls, folder: Path, device: str = "cpu") -> Punctuator:
        """The punctuator of ``folder``, its weights on ``device``."""

    def punctuate(self, texts: list[str]) -> list[PunctuatedText]:
        """Each text punctuated; an empty or blank text gives an empty ``PunctuatedText``."""


# One kind today; the registry is the seam a second one (another checkpoint family) joins.
PUNCTUATORS: Registry[type] = Registry("punctuator", lazy={"ct_transformer": "oasr.models.ct_punc.punctuator"},
                                       contract=Punctuator)
DEFAULT_PUNCTUATOR = "ct_transformer"
