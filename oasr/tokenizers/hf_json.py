"""A Hugging Face ``tokenizer.json`` vocabulary with its special tokens looked up by name (Canary, Cohere).

Text is encoded as plain text: a ``<|en|>`` typed by a user stays characters and never becomes the control token
(the prompt builder places control tokens by id). Decoding drops every special token.
"""

from __future__ import annotations

import re
from pathlib import Path

from tokenizers import Tokenizer

from oasr.errors import CheckpointError
from oasr.tokenizers import TOKENIZERS

# Language tokens are ISO 639-1 codes, <|en|>, <|de|>. Three letters would also match control tokens
# (<|pnc|>, <|itn|>), which is why the pattern is two letters only.
_LANGUAGE_TOKEN = re.compile(r"^<\|([a-z]{2})\|>$")


@TOKENIZERS.register("hf_json")
class HFJsonTokenizer:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise CheckpointError(f"tokenizer file not found: {self.path}")
        self._tok = Tokenizer.from_file(str(self.path))
        # Added tokens written in the text are matched as text, not as the tokens they name.
        self._tok.encode_special_tokens = True
        vocab = self._tok.get_vocab(with_added_tokens=True)
        languages = {m.group(1): i for token, i in vocab.items() if (m := _LANGUAGE_TOKEN.match(token))}
        self.language_ids: dict[str, int] = dict(sorted(languages.items(), key=lambda kv: kv[1]))

    def encode(self, text: str) -> list[int]:
        """Plain text -> piece ids; nothing in it is read as a special token."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, token_ids: list[int]) -> str:
        """Ids -> text, special tokens dropped."""
        return self._tok.decode(token_ids, skip_special_tokens=True)

    def token_id(self, content: str) -> int | None:
        """The id of a token by its name (``"<|endoftext|>"``, ``"▁"``), or None when the vocabulary lacks it."""
        return self._tok.token_to_id(content)

    @property
    def languages(self) -> tuple[str, ...]:
        return tuple(self.language_ids)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)
