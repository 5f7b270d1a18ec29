"""From aligned tokens to words: grouping tokens into words, merging punctuation, and placing words in segments.

The rules follow openai-whisper's word timestamps (``timing.py``, ``tokenizer.py``) so that the same tokens and
the same alignment give the same words and times:
- tokens are cut where their bytes complete a UTF-8 character; languages written without spaces keep those
  pieces as words, others join pieces into words at leading spaces and punctuation;
- punctuation that opens a word is merged into the word after it, punctuation that closes one into the word
  before it;
- words at sentence ends and after pauses are shortened to twice the median word length (the attention tends
  to stretch them over the silence around them), and segment bounds and word times pull on each other.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from oasr.models.base import TextSpan, TimedSegment
from oasr.tokenizers.whisper import WhisperTokenizer
from oasr.types import Word

SPACELESS_LANGUAGES = frozenset({"zh", "ja", "th", "lo", "my", "yue"})
PREPEND_PUNCTUATION = "\"'“¿([{-"
APPEND_PUNCTUATION = "\"'.。,，!！?？:：”)]}、"
_SENTENCE_END = ".。!！?？"
_REPLACEMENT = "\ufffd"
# Word lengths are clipped against the median, which is itself capped: long pauses make long "words".
_MAX_MEDIAN_WORD_S = 0.7
# A segment bound this far from its first/last word's edge is believed over the word.
_SEGMENT_BOUND_SLACK_S = 0.5


@dataclass
class WordTiming:
    """A word while its times are still being adjusted: text (leading space kept), tokens, seconds within the
    window, mean token probability."""

    word: str
    tokens: list[int]
    start: float
    end: float
    probability: float


def _decode(tokenizer: WhisperTokenizer, tokens: Sequence[int]) -> str:
    return b"".join(tokenizer.token_bytes(t) for t in tokens).decode("utf-8", errors="replace")


def split_on_characters(tokenizer: WhisperTokenizer, tokens: Sequence[int]) -> tuple[list[str], list[list[int]]]:
    """Cuts after every token whose bytes complete the text decoded so far into whole characters (a token that
    leaves a character half-written is kept with the tokens that finish it)."""
    whole = _decode(tokenizer, tokens)
    pieces: list[str] = []
    piece_tokens: list[list[int]] = []
    current: list[int] = []
    offset = 0
    for token in tokens:
        current.append(token)
        text = _decode(tokenizer, current)
        # A replacement character that the whole text also has at that place was in the input, not half-written.
        if _REPLACEMENT not in text or whole[offset + text.index(_REPLACEMENT)] == _REPLACEMENT:
            pieces.append(text)
            piece_tokens.append(current)
            current = []
            offset += len(text)
    return pieces, piece_tokens


def split_on_spaces(tokenizer: WhisperTokenizer, tokens: Sequence[int]) -> tuple[list[str], list[list[int]]]:
    """Joins character pieces into words: a new word starts at a leading space, punctuation or a special token."""
    words: list[str] = []
    word_tokens: list[list[int]] = []
    for piece, piece_tokens in zip(*split_on_characters(tokenizer, tokens), strict=True):
        starts_word = (
            piece_tokens[0] >= tokenizer.special.eot
            or piece.startswith(" ")
            or piece.strip() in string.punctuation  # a substring test, as openai-whisper's; "" counts too
            or not words
        )
        if starts_word:
            words.append(piece)
            word_tokens.append(list(piece_tokens))
        else:
            words[-1] += piece
            word_tokens[-1].extend(piece_tokens)
    return words, word_tokens


def split_words(
    tokenizer: WhisperTokenizer, tokens: Sequence[int], language: str | None
) -> tuple[list[str], list[list[int]]]:
    if language in SPACELESS_LANGUAGES:
        return split_on_characters(tokenizer, tokens)
    return split_on_spaces(tokenizer, tokens)


def merge_punctuation(words: list[WordTiming], prepend: str, append: str) -> None:
    """Moves opening punctuation into the next word and closing punctuation into the previous one, in place;
    the emptied entries keep their place (with no text and no tokens) so token counts still add up."""
    i, j = len(words) - 2, len(words) - 1
    while i >= 0:
        previous, following = words[i], words[j]
        if previous.word.startswith(" ") and previous.word.strip() in prepend:
            following.word = previous.word + following.word
            following.tokens = previous.tokens + following.tokens
            previous.word, previous.tokens = "", []
        else:
            j = i
        i -= 1
    i, j = 0, 1
    while j < len(words):
        previous, following = words[i], words[j]
        if not previous.word.endswith(" ") and following.word in append:
            previous.word = previous.word + following.word
            previous.tokens = previous.tokens + following.tokens
            following.word, following.tokens = "", []
        else:
            i = j
        j += 1


def _clip_sentence_ends(words: list[WordTiming], max_duration: float) -> None:
    """Sentence-ending punctuation, and the word right after it, may not last longer than ``max_duration``."""
    for i in range(1, len(words)):
        if words[i].end - words[i].start > max_duration:
            if words[i].word in _SENTENCE_END:
                words[i].end = words[i].start + max_duration
            elif words[i - 1].word in _SENTENCE_END:
                words[i].start = words[i].end - max_duration


def _seconds(value: float) -> float:
    # numpy's rounding (scale, round half to even, unscale), which openai-whisper's times go through.
    return float(np.round(np.float64(value), 2))


def place_words(
    alignment: list[WordTiming],
    spans: Sequence[TextSpan],
    time_offset: float,
    last_speech_end: float,
    *,
    prepend: str = PREPEND_PUNCTUATION,
    append: str = APPEND_PUNCTUATION,
) -> tuple[list[TimedSegment], float]:
    """Adjusts word times and hands each span its words (times from the input's start, rounded to 10 ms).
    ``alignment``: one window's words in window seconds (modified in place); ``last_speech_end``: where speech
    ended before this window. Returns the segments and where speech ends after this window (its last word's
    end; segments shift this only within the window)."""
    durations = np.array([w.end - w.start for w in alignment])
    durations = durations[durations.nonzero()]
    median = min(_MAX_MEDIAN_WORD_S, float(np.median(durations))) if len(durations) else 0.0
    max_duration = median * 2
    if len(durations):
        _clip_sentence_ends(alignment, max_duration)
    merge_punctuation(alignment, prepend, append)

    segments: list[TimedSegment] = []
    index = 0
    for span in spans:
        words: list[dict] = []
        taken = 0
        while index < len(alignment) and taken < span.num_tokens:
            timing = alignment[index]
            if timing.word:
                words.append(
                    dict(
                        word=timing.word,
                        start=_seconds(time_offset + timing.start),
                        end=_seconds(time_offset + timing.end),
                        probability=timing.probability,
                    )
                )
            taken += len(timing.tokens)
            index += 1
        start, end = span.start, span.end
        if words:
            start, end = _fit_segment(words, start, end, median, max_duration, last_speech_end)
            last_speech_end = end
        timed = tuple(Word(w["word"], float(w["start"]), float(w["end"]), float(w["probability"])) for w in words)
        segments.append(TimedSegment(float(start), float(end), timed))
    ends = [segment.words[-1].end for segment in segments if segment.words]
    return segments, ends[-1] if ends else last_speech_end


def _fit_segment(
    words: list[dict], start: float, end: float, median: float, max_duration: float, last_speech_end: float
) -> tuple[float, float]:
    """Shortens a first word that follows a pause, then lets segment bounds and first/last word times settle
    on each other. Modifies ``words``; returns the segment's bounds."""
    first = words[0]
    if first["end"] - last_speech_end > median * 4 and (
        first["end"] - first["start"] > max_duration
        or (len(words) > 1 and words[1]["end"] - first["start"] > max_duration * 2)
    ):
        if len(words) > 1 and words[1]["end"] - words[1]["start"] > max_duration:
            boundary = max(words[1]["end"] / 2, words[1]["end"] - max_duration)
            first["end"] = words[1]["start"] = boundary
        first["start"] = max(0, first["end"] - max_duration)

    if start < first["end"] and start - _SEGMENT_BOUND_SLACK_S > first["start"]:
        first["start"] = max(0, min(first["end"] - median, start))
    else:
        start = first["start"]

    last = words[-1]
    if end > last["start"] and end + _SEGMENT_BOUND_SLACK_S < last["end"]:
        last["end"] = max(last["start"] + median, end)
    else:
        end = last["end"]
    return start, end
