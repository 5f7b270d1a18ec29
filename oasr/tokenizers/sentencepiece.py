"""A SentencePiece ``tokenizer.model``, as NeMo ``.nemo`` archives carry it (Parakeet, Nemotron, Canary).

Decoding is SentencePiece's own ``decode``, which is what NeMo's ``SentencePieceTokenizer.ids_to_text`` calls, so the
text matches NeMo's. Canary's vocabulary holds its prompt tokens (``<|en|>``, ``<|endoftext|>`` ...) as
user-defined or control pieces (named ``<|...|>`` or ``<pad>``-like); those are dropped when decoding and looked up by name for the prompt builder.
Transducer and CTC blanks sit one past the vocabulary; the decode strategies remove them before text is made.
"""

from __future__ import annotations

import re
from pathlib import Path

import sentencepiece

from oasr.errors import CheckpointError
from oasr.tokenizers import TOKENIZERS

# Canary's special tokens: <|en|>, <|startoftranscript|>, <|emo:undefined|>; also <pad>, <unk> style controls.
_SPECIAL_PIECE = re.compile(r"^<\|.*\|>$|^<[a-z_]+>$")
# Language tokens are two-letter ISO 639-1 codes (three letters would catch <|pnc|>, <|itn|>).
_LANGUAGE_TOKEN = re.compile(r"^<\|([a-z]{2})\|>$")


@TOKENIZERS.register("sentencepiece")
class SentencePieceTokenizer:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise CheckpointError(f"tokenizer file not found: {self.path}")
        self._sp = sentencepiece.SentencePieceProcessor()
        try:
            self._sp.Load(str(self.path))
        except (OSError, RuntimeError) as exc:
            raise CheckpointError(f"{self.path} is not a SentencePiece model: {exc}") from None
        pieces = [self._sp.IdToPiece(i) for i in range(self._sp.GetPieceSize())]
        self._ids = {piece: i for i, piece in enumerate(pieces)}
        self._special_ids = frozenset(
            i for i, piece in enumerate(pieces)
            if self._sp.IsControl(i) or (not self._sp.IsUnknown(i) and _SPECIAL_PIECE.match(piece))
        )
        languages = {m.group(1): i for piece, i in self._ids.items() if (m := _LANGUAGE_TOKEN.match(piece))}
        self.language_ids: dict[str, int] = dict(sorted(languages.items(), key=lambda kv: kv[1]))

    def encode(self, text: str) -> list[int]:
        """Plain text -> piece ids. A ``<|en|>`` typed in the text is matched as characters only where the
        model has no such piece; SentencePiece matches user-defined pieces in text."""
        return list(self._sp.EncodeAsIds(text))

    def decode(self, token_ids: list[int]) -> str:
        """Ids -> text as NeMo writes it; special tokens and ids past the vocabulary (blanks) are dropped."""
        size = self._sp.GetPieceSize()
        return self._sp.DecodeIds([t for t in token_ids if 0 <= t < size and t not in self._special_ids])

    def token_id(self, content: str) -> int | None:
        """The id of a piece by name (``"<|endoftext|>"``, ``"▁"``), or None when the vocabulary lacks it."""
        return self._ids.get(content)

    @property
    def languages(self) -> tuple[str, ...]:
        return tuple(self.language_ids)

    @property
    def vocab_size(self) -> int:
        return self._sp.GetPieceSize()
