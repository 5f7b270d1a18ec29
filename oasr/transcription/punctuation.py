"""Punctuation after decoding (``--punctuate DIR``, ``oasr.transcribe(punctuate=DIR)``, ``oasr serve --punctuate
DIR``): a punctuator (``oasr.models.punctuation``) writes a transcript's whole text, and its writing is carried onto
the parts of the result that hold the same characters: the windows' texts, the segments' and the words'. A word
keeps its times; its text takes the marks that follow its characters and the capitals of a sentence's start.

Only models whose capability record says they write no punctuation take one (``writes_punctuation``), or, in
offline runs, a model that can leave its punctuation out (the ``punctuation`` option: SenseVoice's ITN off) asked
to: a punctuator would put marks beside the model's own.

The whole text is punctuated at once, as FunASR punctuates a transcript, so a sentence may run across windows.
Within a part, spaces are the punctuator's (it spaces English words from each other and not from Chinese
characters); a part keeps its own leading space (a word's, a window's).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from oasr.errors import ModelNotFoundError, UnsupportedOptionError
from oasr.models.capabilities import ModelCapabilities
from oasr.models.punctuation import DEFAULT_PUNCTUATOR, PUNCTUATORS, PunctuatedText, Punctuator
from oasr.transcription.results import DecodedWindow
from oasr.types import Transcription, Word


def check_punctuates(capabilities: ModelCapabilities, name: str, punctuation: bool = True) -> None:
    """Refuses a punctuator for a model that writes its own punctuation, naming the option; ``punctuation``:
    the requests ask the model for its own (``DecodeOptions.punctuation``)."""
    if not capabilities.writes_punctuation or (not punctuation and "punctuation" in capabilities.options):
        return
    leave_out = " (or with --no-punctuation, which this model serves)" if "punctuation" in capabilities.options else ""
    raise UnsupportedOptionError(f"{name} writes its own punctuation: --punctuate (punctuate=) adds it to models "
                                 f"that write none, such as FunASR's Paraformer{leave_out}")


def punctuator_for(folder: str | None, capabilities: ModelCapabilities, name: str, device: str = "cpu", *,
                   punctuation: bool = True) -> TranscriptPunctuator | None:
    """The punctuation ``folder`` asks for (None: none), refused for a model that writes its own (``punctuation``:
    as ``check_punctuates``)."""
    if folder is None:
        return None
    check_punctuates(capabilities, name, punctuation)
    return TranscriptPunctuator(load_punctuator(folder, device))


def load_punctuator(folder: str | Path, device: str = "cpu") -> Punctuator:
    """The punctuation model of ``folder`` (a FunASR CT-Transformer folder), on ``device``."""
    path = Path(folder).expanduser()
    if not path.is_dir():
        raise ModelNotFoundError(f"punctuation model folder {str(folder)!r} does not exist")
    return PUNCTUATORS.get(DEFAULT_PUNCTUATOR).load(path, device)


class _Letters:
    """Walks a punctuated text's letters, handing out how each character of the source is written."""

    def __init__(self, source: str, punctuated: PunctuatedText) -> None:
        self.source = "".join(source.split())
        if len(self.source) != len(punctuated.letters):
            raise ValueError(f"the punctuator wrote {len(punctuated.letters)} characters for "
                             f"{len(self.source)}")
        self.punctuated = punctuated
        self.position = 0

    def restyle(self, part: str) -> str:
        """``part`` (the next characters of the source, spaces aside) as the punctuator writes them."""
        written = [part[: len(part) - len(part.lstrip())]]
        first = True
        for char in part:
            if char.isspace():
                continue
            at = self.position
            if at >= len(self.source) or self.source[at] != char:
                raise ValueError(f"a transcript part {part!r} does not follow its text at character {at}")
            if self.punctuated.spaced[at] and not first:
                written.append(" ")
            written.append(self.punctuated.letters[at] + self.punctuated.marks[at])
            self.position, first = at + 1, False
        return "".join(written)


def _word(word: Word, letters: _Letters) -> Word:
    return replace(word, word=letters.restyle(word.word))


def punctuate_transcription(result: Transcription, punctuated: PunctuatedText) -> Transcription:
    """``result`` with ``punctuated`` (its text as the punctuator wrote it) carried onto its text, segments and
    their words."""
    segment_letters, word_letters = _Letters(result.text, punctuated), _Letters(result.text, punctuated)
    segments = [replace(segment, text=segment_letters.restyle(segment.text),
                        words=tuple(_word(w, word_letters) for w in segment.words)) for segment in result.segments]
    return replace(result, text=_Letters(result.text, punctuated).restyle(result.text), segments=segments)


def punctuate_windows(windows: list[DecodedWindow], punctuated: PunctuatedText) -> list[DecodedWindow]:
    """Decoded windows with ``punctuated`` (their joined, stripped text as the punctuator wrote it) carried onto
    their texts, segments and words: what ``assemble`` and the server's answers read."""
    source = "".join(w.text for w in windows)
    text_letters, segment_letters, word_letters = (_Letters(source, punctuated) for _ in range(3))
    punctuated_windows = []
    for window in windows:
        # a segment's words are its window's (``with_words``): each is restyled once, in the window's order
        words = {id(w): _word(w, word_letters) for w in window.words}
        segments = tuple(replace(s, text=segment_letters.restyle(s.text),
                                 words=tuple(words.get(id(w), w) for w in s.words))
                         for s in window.segments)
        punctuated_windows.append(replace(window, text=text_letters.restyle(window.text), segments=segments,
                                          words=tuple(words.values())))
    return punctuated_windows


@dataclass(frozen=True)
class TranscriptPunctuator:
    """A loaded punctuator applied to whole results (offline runs) or to a request's windows (the server)."""

    punctuator: Punctuator

    def transcriptions(self, results: list[Transcription]) -> list[Transcription]:
        """Each result punctuated (one without text, or failed, unchanged)."""
        texts = [r.text for r in results]
        written = self.punctuator.punctuate(texts)
        return [punctuate_transcription(r, p) if r.ok and r.text.strip() else r for r, p in zip(results, written)]

    def windows(self, windows: list[DecodedWindow]) -> list[DecodedWindow]:
        source = "".join(w.text for w in windows).strip()
        if not source:
            return windows
        [written] = self.punctuator.punctuate([source])
        return punctuate_windows(windows, written)

    def text(self, text: str) -> str:
        """One text punctuated (a realtime turn's transcript), stripped as OASR's texts are."""
        if not text.strip():
            return text
        [written] = self.punctuator.punctuate([text])
        return written.text.strip()
