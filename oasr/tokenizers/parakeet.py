"""Parakeet's SentencePiece vocabulary, as the ``tokenizer.json`` that Hugging Face Parakeet checkpoints ship.

The decode strategies hand over token ids with blanks and CTC repeats already removed, so decoding is a plain
ids -> text: special tokens (pad, blank, unk) are dropped and the '▁' word-boundary marks become spaces.
The blank id itself is declared by the model's config, not looked up here.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from oasr.errors import CheckpointError
from oasr.tokenizers import TOKENIZERS

_WORD_BOUNDARY = "\u2581"  # SentencePiece's '▁'


@TOKENIZERS.register("parakeet_hf_json")
class ParakeetTokenizer:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise CheckpointError(f"tokenizer file not found: {self.path}")
        self._tok = Tokenizer.from_file(str(self.path))
        self._special_ids = {
            token_id for token_id, added in self._tok.get_added_tokens_decoder().items() if added.special
        }

    def encode(self, text: str) -> list[int]:
        """Plain text -> piece ids, without special tokens."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, token_ids: list[int]) -> str:
        """Piece ids -> text. Special tokens are dropped; ids are taken as given (no CTC collapsing here)."""
        if self._tok.decoder is not None:
            return self._tok.decode(token_ids, skip_special_tokens=True)
        # A vocabulary without a decoder: undo SentencePiece's word-boundary marks by hand.
        pieces = [self._tok.id_to_token(t) for t in token_ids if t not in self._special_ids]
        return "".join(p for p in pieces if p is not None).replace(_WORD_BOUNDARY, " ").strip()

    def token_id(self, content: str) -> int | None:
        """The id of a token such as ``"<blank>"``, or None when the vocabulary lacks it."""
        return self._tok.token_to_id(content)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)
