"""A FunASR token list (``tokens.json``: a JSON list; ``tokens.txt``: one token a line), index = token id.

Decoding follows FunASR's character-vocabulary rules (``oasr.tokenizers.funasr_text``): Chinese characters
joined, English words spaced, ``@@`` pieces glued, single-letter runs upper-cased; <s>, </s> and <unk> dropped.
"""

from __future__ import annotations

import json
from pathlib import Path

from oasr.errors import CheckpointError
from oasr.tokenizers import TOKENIZERS
from oasr.tokenizers.funasr_text import Sentence, sentence_words


def read_token_list(path: Path) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8")
        tokens = json.loads(text) if path.suffix == ".json" else [
            line.split()[0] if line.split() else line for line in text.splitlines()]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"cannot read the token list {path}: {exc}") from None
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        raise CheckpointError(f"{path} is not a list of token strings")
    return tokens


@TOKENIZERS.register("funasr_tokens")
class FunasrTokenizer:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise CheckpointError(f"token list not found: {self.path}")
        self.token_list = read_token_list(self.path)
        self._ids = {token: i for i, token in enumerate(self.token_list)}

    def tokens(self, token_ids: list[int]) -> list[str]:
        """Ids -> their token strings (an id past the list is refused)."""
        try:
            return [self.token_list[i] for i in token_ids]
        except IndexError:
            raise CheckpointError(f"token id out of range of {self.path.name} ({len(self.token_list)} tokens)") from None

    def decode(self, token_ids: list[int]) -> str:
        """Ids -> FunASR's text."""
        return sentence_words(self.tokens(token_ids)).text

    def sentence(self, token_ids: list[int], spans: list[list[int]] | None = None) -> Sentence:
        """Ids (and each token's [start_ms, end_ms]) -> FunASR's words and their spans."""
        return sentence_words(self.tokens(token_ids), spans)

    def encode(self, text: str) -> list[int]:
        """Text -> ids: each space-separated word if the list holds it, else its characters (unknown ones as
        <unk>). FunASR's CharTokenizer splits the same way for whole-word vocabularies."""
        unk = self._ids.get("<unk>")
        ids: list[int] = []
        for word in text.split():
            pieces = [word] if word in self._ids else list(word)
            ids.extend(i for i in (self._ids.get(p, unk) for p in pieces) if i is not None)
        return ids

    def token_id(self, content: str) -> int | None:
        return self._ids.get(content)

    @property
    def vocab_size(self) -> int:
        return len(self.token_list)


@TOKENIZERS.register("funasr_tokens_timed")
class FunasrTimedTokenizer(FunasrTokenizer):
    """FunASR's text as its models with a timestamp predictor write it (SeACo-Paraformer's ``CifPredictorV3``):
    ``sentence_postprocess`` is then always given the tokens' times, and forms words joined by spaces. The times
    only ride along with the words, so any will do."""

    def decode(self, token_ids: list[int]) -> str:
        tokens = self.tokens(token_ids)
        return sentence_words(tokens, [[0, 0]] * len(tokens)).text
