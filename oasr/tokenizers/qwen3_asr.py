"""Qwen3-ASR's vocabulary: Qwen2's byte-level BPE ``tokenizer.json``, special tokens looked up by name.

The model writes ``language English<asr_text>the text``: the spoken language's name, the ``<asr_text>`` marker,
then the transcript (``language None<asr_text>`` for audio without speech). When the language is forced, the
prompt ends with that head and the model writes the transcript only. ``decode`` gives the transcript, that is
what follows the last ``<asr_text>`` (everything when there is none); ``spoken_language`` the name in the head.
"""

from __future__ import annotations

from collections.abc import Sequence

from oasr.tokenizers import TOKENIZERS
from oasr.tokenizers.hf_json import HFJsonTokenizer

ASR_TEXT = "<asr_text>"
_LANGUAGE_PREFIX = "language "


@TOKENIZERS.register("qwen3_asr_json")
class Qwen3ASRTokenizer(HFJsonTokenizer):
    def __init__(self, path) -> None:
        super().__init__(path)
        self.language_ids = {}  # no language tokens: the language is written as a word
        self.asr_text_id = self.token_id(ASR_TEXT)

    def _marker(self, token_ids: Sequence[int]) -> int | None:
        """Index of the last ``<asr_text>`` in ``token_ids``, or None."""
        ids = list(token_ids)
        if self.asr_text_id is None or self.asr_text_id not in ids:
            return None
        return len(ids) - 1 - ids[::-1].index(self.asr_text_id)

    def decode(self, token_ids: list[int]) -> str:
        """The transcript of the model's output (special tokens dropped)."""
        marker = self._marker(token_ids)
        return super().decode(list(token_ids) if marker is None else list(token_ids)[marker + 1 :])

    def spoken_language(self, token_ids: Sequence[int]) -> str | None:
        """The language name the output's head gives (``language English<asr_text>`` -> ``"English"``); None
        without a head, or for ``language None``."""
        marker = self._marker(token_ids)
        if marker is None:
            return None
        head = super().decode(list(token_ids)[:marker]).strip()
        for line in reversed(head.splitlines()):
            if line.startswith(_LANGUAGE_PREFIX):
                name = line[len(_LANGUAGE_PREFIX) :].strip()
                return None if name.lower() == "none" or not name else name
        return None
