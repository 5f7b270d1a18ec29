"""FunASR's token-to-text rules for character vocabularies (``funasr.utils.postprocess_utils``), kept
behaviour for behaviour so that OASR's text and word timings equal ``AutoModel.generate``'s.

A Paraformer vocabulary mixes Chinese characters (each a word), whole English words and BPE pieces ending in
``@@`` (glued to the next piece). ``sentence_words`` groups tokens into words (with the per-token times when
given, a word spanning its pieces), then runs of single ASCII letters separated by spaces become one upper-case
abbreviation ("a b c" -> "ABC"). Without times the text is the words joined as they are (spaces only after
English words); with times FunASR joins every word with a space, and ``sentence_words`` reports that text too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

Span = list[int]  # [start_ms, end_ms], as FunASR writes timestamps
DROPPED = ("<s>", "</s>", "<unk>", "<OOV>")


@dataclass(frozen=True)
class Sentence:
    """text: FunASR's ``text``; words: the words (no spaces); spans: each word's [start_ms, end_ms] when the
    tokens came with times (FunASR's ``timestamp``), else empty."""

    text: str
    words: tuple[str, ...]
    spans: tuple[tuple[int, int], ...] = ()


def is_chinese(ch: str) -> bool:
    """FunASR counts CJK ideographs, ASCII digits and '@' as Chinese (each its own word)."""
    return "\u4e00" <= ch <= "\u9fff" or "0" <= ch <= "9" or ch == "@"


def _cleaned(token: str) -> str:
    for mark in (" ", *DROPPED):
        token = token.replace(mark, "")
    return token


def all_chinese(tokens: Sequence[str] | str) -> bool:
    """FunASR's ``isAllChinese``: every token (or character of a string), cleaned, is "Chinese" (an empty one
    is not)."""
    cleaned = [_cleaned(t) for t in tokens]
    return bool(cleaned) and all(_is_chinese_token(t) for t in cleaned)


def _is_chinese_token(token: str) -> bool:
    # FunASR calls isChinese on a whole token: a string of several characters compares as a string.
    return "\u4e00" <= token <= "\u9fff" or "0" <= token <= "9" or token == "@"


def all_alpha(tokens: Sequence[str] | str) -> bool:
    """FunASR's ``isAllAlpha``: every cleaned token is letters (or an apostrophe) and none is "Chinese"."""
    cleaned = [_cleaned(t) for t in tokens]
    if not cleaned:
        return False
    for token in cleaned:
        if not token.isalpha() and token != "'":
            return False
        if token.isalpha() and _is_chinese_token(token):
            return False
    return True


def sentence_words(tokens: Sequence[str], spans: Sequence[Span] | None = None) -> Sentence:
    """FunASR's ``sentence_postprocess``: tokens (and optionally each token's [start_ms, end_ms]) -> the text,
    the words and, with spans, each word's span."""
    middle = [t for t in tokens if t not in DROPPED]
    words: list[str] = []
    word_spans: list[Span] = []
    timed = spans is not None
    if all_chinese(middle):
        words = [t.replace(" ", "") for t in middle]
        if timed:
            word_spans = [list(s) for s in spans]  # type: ignore[union-attr]
    elif all_alpha(middle):
        _group_alpha(middle, spans, words, word_spans)
    else:
        _group_mixed(middle, spans, words, word_spans)
    if timed:
        words, word_spans = abbreviations(words, word_spans)
        real = [w for w in words if w != " "]
        return Sentence(" ".join(real).strip(), tuple(real), tuple((s[0], s[1]) for s in word_spans))
    words = abbreviations(words, None)[0]
    return Sentence("".join(words).strip(), tuple(w for w in words if w != " "))


def _group_alpha(middle: list[str], spans: Sequence[Span] | None, words: list[str], word_spans: list[Span]) -> None:
    """All-English tokens: pieces ending in @@ glue onto the next; each finished word is followed by a space."""
    item, open_word = "", True
    begin = end = 0
    for i, token in enumerate(middle):
        if open_word and spans is not None:
            begin, end = spans[i]
        if "@@" in token:
            item += token.replace("@@", "")
            if spans is not None:
                open_word, end = False, spans[i][1]
        else:
            item += token
            words.extend([item, " "])
            item = ""
            if spans is not None:
                open_word, end = True, spans[i][1]
                word_spans.append([begin, end])
                begin = end


def _group_mixed(middle: list[str], spans: Sequence[Span] | None, words: list[str], word_spans: list[Span]) -> None:
    """Chinese and English together: a Chinese token is a word (and takes back the space an English word left
    before it); English pieces glue as in ``_group_alpha``; anything else is kept as it is, untimed."""
    alpha_blank, open_word = False, True
    item = ""
    begin = end = -1
    for i, token in enumerate(middle):
        if open_word and spans is not None:
            begin, end = spans[i]
        if all_chinese(token):
            if alpha_blank:
                words.pop()
            words.append(token)
            alpha_blank = False
            if spans is not None:
                open_word = True
                word_spans.append([begin, end])
                begin = end
        elif "@@" in token:
            item += token.replace("@@", "")
            alpha_blank = False
            if spans is not None:
                open_word, end = False, spans[i][1]
        elif all_alpha(token):
            item += token
            words.extend([item, " "])
            item = ""
            alpha_blank = True
            if spans is not None:
                open_word, end = True, spans[i][1]
                word_spans.append([begin, end])
                begin = end
        else:
            words.append(token)


def _single_letter(word: str) -> bool:
    return len(word) == 1 and word.isascii() and word.isalpha()


def _abbreviation_bounds(words: list[str]) -> tuple[list[int], list[int]]:
    """Where runs of single letters separated by spaces start and end (FunASR's first pass of ``abbr_dispose``)."""
    begins: list[int] = []
    ends: list[int] = []
    size, last = len(words), -1
    for start in range(size):
        if start <= last or not _single_letter(words[start]):
            continue
        if not (start + 2 < size and words[start + 1] == " " and _single_letter(words[start + 2])):
            continue
        begins.append(start)
        num = start + 2
        ends.append(num)
        while True:
            num += 1
            if num < size and words[num] == " ":
                num += 1
                if num < size and _single_letter(words[num]):
                    ends[-1] = num
                    last = num
                else:
                    break
            else:
                break
    return begins, ends


def abbreviations(words: list[str], spans: list[Span] | None) -> tuple[list[str], list[Span]]:
    """FunASR's ``abbr_dispose``: each run of single letters becomes one upper-case word; with spans, the run
    spans from its first letter's start to its last letter's end."""
    begins, ends = _abbreviation_bounds(words)
    size = len(words)
    span_index, index_of = 0, []
    for word in words:
        index_of.append(span_index)
        if word != " ":
            span_index += 1
    out: list[str] = []
    out_spans: list[Span] = []
    last, begin = -1, 0
    for num in range(size):
        if num <= last:
            continue
        if num in begins:
            if spans is not None:
                begin = spans[index_of[num]][0]
            word = words[num].upper()
            num += 1
            while num < size:
                if num in ends:
                    word += words[num].upper()
                    last = num
                    break
                if words[num].isascii() and words[num].isalpha():
                    word += words[num].upper()
                num += 1
            out.append(word)
            if spans is not None and index_of[num] < len(spans):
                out_spans.append([begin, spans[index_of[num]][1]])
        else:
            out.append(words[num])
            if spans is not None and index_of[num] < len(spans) and words[num] != " ":
                out_spans.append(list(spans[index_of[num]]))
    return out, out_spans
