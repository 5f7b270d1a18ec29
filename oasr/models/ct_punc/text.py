"""FunASR's CT-Transformer text rules, without torch: how a text is cut into words, how the words are classified in
mini-sentences, and how the classes are written back (FunASR 1.4.16's ``CTTransformer.inference`` and
``split_words``, character-level checkpoints).

- **Words**: the text is split at whitespace, then each run of ASCII characters is one word and every other
  character (a Chinese character) a word of its own.
- **Mini-sentences**: words are classified ``split_size`` (20) at a time. Before the last mini-sentence, only the
  words up to the last sentence end ("。" or "？") found from its second-to-last word back to its third are kept;
  the rest are classified again at the head of the next one. A carried run longer than 200 words without a
  sentence end is cut at its last comma, which becomes a sentence end.
- **Writing**: an ASCII word is capitalised at the start of each kept run and after a sentence end, and spaced
  from a run's start or an ASCII word before it (not from a Chinese character); after an ASCII word "，", "。",
  "？" are written ",", ".", "?". The text's last mark becomes a sentence end ("，" and "、" become "。", "," becomes
  "."), or one is added when the text ends without "。", "？", "." or "?".

The spacing depends on where kept runs start, so the rules follow the mini-sentence walk rather than a simpler
equivalent.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from oasr.models.ct_punc.config import NO_MARK
from oasr.models.punctuation import PunctuatedText

SPLIT_SIZE = 20  # words per mini-sentence (FunASR's ``split_size`` default)
LONG_CARRY = 200  # a carried run longer than this is cut at its last comma (FunASR's ``cache_pop_trigger_limit``)
SENTENCE_ENDS = ("。", "？")
COMMA = "，"
# What an ASCII word's marks are written as.
ASCII_MARKS = {"，": ",", "。": ".", "？": "?"}

# classify(word ids of one mini-sentence) -> one class id per word
Classifier = Callable[[Sequence[int]], list[int]]


def is_ascii(char: str) -> bool:
    return ord(char) < 128


def split_words(text: str) -> list[str]:
    """The words of ``text``: runs of ASCII characters within whitespace-separated pieces, and each other character."""
    words = []
    for piece in text.split():
        run = ""
        for char in piece:
            if is_ascii(char):
                run += char
                continue
            if run:
                words.append(run)
                run = ""
            words.append(char)
        if run:
            words.append(run)
    return words


def mini_sentences(num_words: int, size: int) -> list[range]:
    """Consecutive index ranges of ``size`` words, the last holding the rest."""
    if size < 2:
        raise ValueError(f"split_size must be at least 2, got {size}")
    return [range(start, min(start + size, num_words)) for start in range(0, num_words, size)] or [range(0)]


@dataclass
class _Written:
    """Words as written so far: each word's text (capitals changed), its leading space and its mark."""

    words: list[str]
    spaced: list[bool]
    marks: list[str]


def punctuate_words(words: Sequence[str], word_ids: Sequence[int], classify: Classifier,
                    punc_list: Sequence[str], sentence_end_id: int, split_size: int = SPLIT_SIZE) -> PunctuatedText:
    """Classifies ``words`` (their vocabulary ids ``word_ids``) mini-sentence by mini-sentence and writes them."""
    written = _Written([], [], [])
    if not words:
        return PunctuatedText("", (), ())
    carried: list[int] = []  # indices of words classified again with the next mini-sentence
    ranges = mini_sentences(len(words), split_size)
    classes: list[int] = []
    for number, new in enumerate(ranges):
        indices = carried + list(new)
        classes = list(classify([word_ids[i] for i in indices]))
        if len(classes) != len(indices):
            raise ValueError(f"the classifier gave {len(classes)} classes for {len(indices)} words")
        if number < len(ranges) - 1:
            cut = _last_sentence_end(classes, punc_list)
            if cut < 0 and len(indices) > LONG_CARRY:
                cut = _last_comma(classes, punc_list)
                if cut >= 0:
                    classes[cut] = sentence_end_id
            carried = indices[cut + 1:]
            indices, classes = indices[:cut + 1], classes[:cut + 1]
        _write_run([words[i] for i in indices], classes, punc_list, written)
    _end_sentence(written)
    return _letters(written)


def _last_sentence_end(classes: list[int], punc_list: Sequence[str]) -> int:
    """The last sentence end among positions len-2 down to 2 (FunASR's search range), or -1."""
    for position in range(len(classes) - 2, 1, -1):
        if punc_list[classes[position]] in SENTENCE_ENDS:
            return position
    return -1


def _last_comma(classes: list[int], punc_list: Sequence[str]) -> int:
    """The last comma within the same range, or -1 (asked only when there is no sentence end there)."""
    for position in range(len(classes) - 2, 1, -1):
        if punc_list[classes[position]] == COMMA:
            return position
    return -1


def _write_run(words: list[str], classes: list[int], punc_list: Sequence[str], written: _Written) -> None:
    """One kept run of words with their classes, appended to ``written``."""
    for position, (word, mark_id) in enumerate(zip(words, classes)):
        ascii_word = is_ascii(word[0])
        after_end = position == 0 or punc_list[classes[position - 1]] in SENTENCE_ENDS
        written.words.append(word.capitalize() if ascii_word and after_end else word)
        written.spaced.append(ascii_word and (position == 0 or is_ascii(words[position - 1][0])))
        mark = punc_list[mark_id]
        if mark == NO_MARK:
            mark = ""
        elif ascii_word:
            mark = ASCII_MARKS.get(mark, mark)
        written.marks.append(mark)


def _end_sentence(written: _Written) -> None:
    """The text's last character made a sentence end, as FunASR's last mini-sentence does (that character is the
    last word's mark, or the word's own last character when it has none)."""
    mark = written.marks[-1]
    last = (mark or written.words[-1])[-1]
    replaced = {"，": "。", "、": "。", ",": "."}.get(last)
    if replaced is not None and mark:
        written.marks[-1] = mark[:-1] + replaced
    elif replaced is not None:
        written.words[-1] = written.words[-1][:-1] + replaced
    elif not is_ascii(last) and last not in SENTENCE_ENDS:
        written.marks[-1] = mark + "。"
    elif is_ascii(last) and last not in (".", "?"):
        written.marks[-1] = mark + "."


def _letters(written: _Written) -> PunctuatedText:
    """Word-level writing spread over the words' characters: a word's space goes before its first, its mark after
    its last."""
    letters, spaced, marks = [], [], []
    for word, space, mark in zip(written.words, written.spaced, written.marks):
        letters.append(word)
        spaced.extend([space] + [False] * (len(word) - 1))
        marks.extend([""] * (len(word) - 1) + [mark])
    return PunctuatedText("".join(letters), tuple(spaced), tuple(marks))
