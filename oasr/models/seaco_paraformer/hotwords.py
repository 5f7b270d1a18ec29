"""How SeACo-Paraformer spells a request's hotwords as token ids, as FunASR's ``generate_hotwords_list`` does.

A phrase is one line of FunASR's hotword file: its whitespace-separated words are spelled one after another and
make one hotword. With a ``seg_dict`` in the model folder (the released SeACo folders carry one), each word is
lowercased and looked up there; a word it lacks that is all CJK characters or digits is spelled character by
character through it; anything else becomes ``<unk>``. Without a ``seg_dict`` each word must be a token itself
(else ``<unk>``). FunASR then appends ``[<s>]``, the "no hotword" entry the bias attention may always pick.

FunASR's hotwords carry no weight, so a phrase's ``:boost`` has nothing to steer: a boost other than the default
is refused rather than silently dropped. FunASR filters a list of more than ``MAX_UNFILTERED`` phrases down to
the likeliest (its ASF step), which OASR does not do yet: such a list is refused too.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from oasr.errors import UnsupportedOptionError
from oasr.types import DEFAULT_HOTWORD_BOOST, Hotword

# FunASR's ``nfilter`` (50) counts the appended <s> entry: from 50 phrases on it filters.
MAX_UNFILTERED = 49
UNSPELLED = "<unk>"  # what FunASR writes for a word seg_dict cannot spell (then looked up as any token)
_CJK_OR_DIGITS = re.compile(r"^[\u4E00-\u9FA50-9]+$")  # FunASR's pattern for words it spells by character


@dataclass(frozen=True, eq=False)
class HotwordSpelling:
    """The token list (index = id), the folder's ``seg_dict`` (word -> its tokens; None when it has none) and the
    token unknown words become."""

    tokens: Sequence[str]
    seg_dict: Mapping[str, Sequence[str]] | None = None
    unk: str = "<unk>"
    token_ids: dict[str, int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        # FunASR's tokenizer refuses a token list with a repeated token; the converter reads only valid ones.
        object.__setattr__(self, "token_ids", {token: i for i, token in enumerate(self.tokens)})
        if self.unk not in self.token_ids:
            raise ValueError(f"the token list has no {self.unk!r} for words it cannot spell")

    @classmethod
    def from_dict(cls, values: Mapping) -> HotwordSpelling:
        return cls(tuple(values["tokens"]), values.get("seg_dict"), values.get("unk", "<unk>"))

    def to_dict(self) -> dict:
        return {"tokens": list(self.tokens), "seg_dict": None if self.seg_dict is None else dict(self.seg_dict),
                "unk": self.unk}

    def words_as_tokens(self, words: Sequence[str]) -> list[str]:
        if self.seg_dict is None:
            return list(words)
        tokens: list[str] = []
        for word in (w.lower() for w in words):
            if word in self.seg_dict:
                tokens.extend(self.seg_dict[word])
            elif _CJK_OR_DIGITS.match(word):
                tokens.extend(t for c in word for t in self.seg_dict.get(c, (UNSPELLED,)))
            else:
                tokens.append(UNSPELLED)
        return tokens

    def spell(self, phrase: str) -> list[int]:
        """A phrase's token ids (one hotword)."""
        unk = self.token_ids[self.unk]
        return [self.token_ids.get(t, unk) for t in self.words_as_tokens(phrase.split())]


def check_hotwords(hotwords: Sequence[Hotword], name: str) -> None:
    """Refuses what SeACo's hotwords cannot mean: a boost, or more phrases than FunASR biases unfiltered."""
    boosted = [h for h in hotwords if h.boost != DEFAULT_HOTWORD_BOOST]
    if boosted:
        raise UnsupportedOptionError(f"{name}: SeACo-Paraformer's hotwords carry no boost (FunASR's have no weight); "
                                     f"give {boosted[0].phrase!r} without ':{boosted[0].boost:g}'")
    if len(hotwords) > MAX_UNFILTERED:
        raise UnsupportedOptionError(f"{name}: {len(hotwords)} hotwords; SeACo-Paraformer serves at most "
                                     f"{MAX_UNFILTERED} (FunASR filters longer lists, which OASR does not yet)")
