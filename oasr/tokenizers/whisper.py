"""Whisper's byte-level BPE from a ``tokenizer.json``, with its special tokens looked up by name.

English-only and multilingual vocabularies place the special tokens at different ids (``<|endoftext|>`` is
50256 in both, ``<|startoftranscript|>`` 50257 vs 50258, ...), so nothing here hard-codes an id. Timestamp
tokens are not in ``tokenizer.json``: they follow ``<|notimestamps|>``, one per 20 ms.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

from oasr.errors import CheckpointError, UnsupportedOptionError
from oasr.tokenizers import TOKENIZERS

_TIMESTAMP_STEP_S = 0.02
_LANGUAGE_TOKEN = re.compile(r"^<\|([a-z]{2,3}|haw|yue)\|>$")
_TASKS = ("transcribe", "translate")


def _byte_level_alphabet() -> dict[str, int]:
    """The byte-level BPE alphabet (GPT-2's): printable bytes stand for themselves, the other bytes are shifted
    to code points 256 and up so that every token is printable. Maps each character back to its byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {b: chr(b) for b in printable}
    shifted = (b for b in range(256) if b not in chars)
    chars.update({b: chr(256 + n) for n, b in enumerate(shifted)})
    return {c: b for b, c in chars.items()}


@dataclass(frozen=True)
class WhisperSpecialTokens:
    eot: int
    sot: int
    translate: int
    transcribe: int
    sot_prev: int
    sot_lm: int
    no_speech: int
    no_timestamps: int
    language_ids: dict[str, int]

    @property
    def timestamp_begin(self) -> int:
        return self.no_timestamps + 1


@TOKENIZERS.register("whisper_hf_json")
class WhisperTokenizer:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise CheckpointError(f"tokenizer file not found: {self.path}")
        self._tok = Tokenizer.from_file(str(self.path))
        self.special = self._resolve_special()
        self._char_bytes = _byte_level_alphabet()

    def _id(self, content: str) -> int:
        token_id = self._tok.token_to_id(content)
        if token_id is None:
            raise CheckpointError(f"{self.path} has no special token {content!r}")
        return token_id

    def _resolve_special(self) -> WhisperSpecialTokens:
        no_speech = self._tok.token_to_id("<|nospeech|>")
        if no_speech is None:
            no_speech = self._id("<|nocaptions|>")
        languages = {}
        for token_id, added in self._tok.get_added_tokens_decoder().items():
            match = _LANGUAGE_TOKEN.match(added.content)
            if match:
                languages[match.group(1)] = token_id
        return WhisperSpecialTokens(
            eot=self._id("<|endoftext|>"),
            sot=self._id("<|startoftranscript|>"),
            translate=self._id("<|translate|>"),
            transcribe=self._id("<|transcribe|>"),
            sot_prev=self._id("<|startofprev|>"),
            sot_lm=self._id("<|startoflm|>"),
            no_speech=no_speech,
            no_timestamps=self._id("<|notimestamps|>"),
            language_ids=dict(sorted(languages.items(), key=lambda kv: kv[1])),
        )

    def language_id(self, language: str) -> int:
        try:
            return self.special.language_ids[language]
        except KeyError:
            raise UnsupportedOptionError(
                f"unknown language {language!r}; this vocabulary knows: {', '.join(self.special.language_ids)}"
            ) from None

    def task_id(self, task: str) -> int:
        if task not in _TASKS:
            raise UnsupportedOptionError(f"unknown task {task!r}; choose one of {', '.join(_TASKS)}")
        return self.special.transcribe if task == "transcribe" else self.special.translate

    def language_of(self, token_id: int) -> str | None:
        for language, lid in self.special.language_ids.items():
            if lid == token_id:
                return language
        return None

    def encode(self, text: str) -> list[int]:
        """Plain text -> BPE ids, without any special tokens. The text is never searched for added tokens: a
        prompt that says ``<|endoftext|>`` means those characters, not the control token. ``Tokenizer.encode``
        would match them (``encode_special_tokens`` spares only the tokens flagged special, and Hugging Face
        vocabularies add the timestamp tokens unflagged), so the pre-tokenizer and the BPE model run directly."""
        if self._tok.normalizer is not None:
            text = self._tok.normalizer.normalize_str(text)
        pieces = self._tok.pre_tokenizer.pre_tokenize_str(text)
        return [token.id for piece, _ in pieces for token in self._tok.model.tokenize(piece)]

    def decode(self, token_ids: list[int]) -> str:
        """Ids -> text; special and timestamp tokens (every id >= ``<|endoftext|>``) are dropped."""
        eot = self.special.eot
        return self._tok.decode([t for t in token_ids if t < eot], skip_special_tokens=False)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for, which may be part of a UTF-8 character; special tokens give their
        ``<|...|>`` name and timestamp tokens ``<|1.08|>``, as openai-whisper's ``decode_with_timestamps`` does."""
        if token_id >= self.special.timestamp_begin:
            return f"<|{(token_id - self.special.timestamp_begin) * _TIMESTAMP_STEP_S:.2f}|>".encode()
        piece = self._tok.id_to_token(token_id)
        if piece is None:
            raise ValueError(f"token id {token_id} is not in {self.path.name}")
        if token_id >= self.special.eot:
            return piece.encode()
        return bytes(self._char_bytes[c] for c in piece)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)
