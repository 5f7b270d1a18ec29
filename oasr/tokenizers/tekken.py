"""Mistral's ``tekken.json`` vocabulary (Voxtral), read the way mistral-common's ``Tekkenizer`` reads it.

The file holds a byte-level BPE as tiktoken ranks (``vocab``: base64 bytes by rank), the split pattern, and the
control tokens (``special_tokens``: ``<s>``, ``[INST]``, ``[AUDIO]``, ``[TRANSCRIBE]`` ...). Control tokens take the
first ``default_num_special_tokens`` ids (unnamed ones are filled in as ``<SPECIAL_i>``); a BPE rank r is id
``r + num_special``, and only the first ``default_vocab_size - num_special`` ranks are kept. Text is encoded as
plain text, so a ``[TRANSCRIBE]`` typed by a user stays characters; decoding drops every control token.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

from oasr.errors import CheckpointError
from oasr.tokenizers import TOKENIZERS

_FILLER = "<SPECIAL_{}>"


@TOKENIZERS.register("tekken")
class TekkenTokenizer:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise CheckpointError(f"tokenizer file not found: {self.path}")
        try:
            import tiktoken
        except ImportError as exc:  # a declared dependency; a broken install should still say what is missing
            raise CheckpointError("reading tekken.json needs the tiktoken package (pip install tiktoken)") from exc
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            config = data["config"]
            num_special = int(config["default_num_special_tokens"])
            inner = int(config["default_vocab_size"]) - num_special
            ranks = {base64.b64decode(entry["token_bytes"]): entry["rank"] for entry in data["vocab"][:inner]}
            named = {int(entry["rank"]): str(entry["token_str"]) for entry in data.get("special_tokens", [])}
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"{self.path}: not a tekken vocabulary ({exc})") from None
        if sorted(ranks.values()) != list(range(len(ranks))):
            raise CheckpointError(f"{self.path}: the BPE ranks are not 0 .. {len(ranks) - 1}")
        self.num_special = num_special
        self.specials = [named.get(i, _FILLER.format(i)) for i in range(num_special)]
        self._special_ids = {name: i for i, name in enumerate(self.specials)}
        self._bpe = tiktoken.Encoding(name=self.path.stem, pat_str=config["pattern"], mergeable_ranks=ranks,
                                      special_tokens={})
        self.audio = data.get("audio")  # the release's audio settings (sampling rate, chunk length), if any
        self.language_ids: dict[str, int] = {}  # languages are written as text (``lang:en``), not tokens

    def encode(self, text: str) -> list[int]:
        """Plain text -> ids; nothing in it is read as a control token."""
        return [i + self.num_special for i in self._bpe.encode(text, disallowed_special=())]

    def decode(self, token_ids: list[int]) -> str:
        """Ids -> text, control tokens dropped (bytes of a character split across ids are joined first)."""
        pieces = [i - self.num_special for i in token_ids if i >= self.num_special]
        return self._bpe.decode_bytes(pieces).decode("utf-8", errors="replace")

    def token_id(self, content: str) -> int | None:
        """The id of a control token by its name (``"[TRANSCRIBE]"``), or None when the vocabulary lacks it."""
        return self._special_ids.get(content)

    @property
    def languages(self) -> tuple[str, ...]:
        return ()

    @property
    def vocab_size(self) -> int:
        return self.num_special + self._bpe.n_vocab
