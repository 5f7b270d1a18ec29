"""SenseVoice's SentencePiece vocabulary: the ``sentencepiece`` tokenizer, plus the reading of the tags the model
writes before its text (``<|en|><|NEUTRAL|><|Speech|><|withitn|>``) into the emotion and the audio event it found.

Torch-free: the server's API processes read the tags from a finished request's token ids.
"""

from __future__ import annotations

from collections.abc import Sequence

from oasr.tokenizers import TOKENIZERS
from oasr.tokenizers.sentencepiece import SentencePieceTokenizer

# The tags of SenseVoice-Small's vocabulary, by kind (the text inside ``<|...|>``).
EMOTIONS = ("HAPPY", "SAD", "ANGRY", "NEUTRAL", "FEARFUL", "DISGUSTED", "SURPRISED", "EMO_UNKNOWN")
EVENTS = ("Speech", "BGM", "Applause", "Laughter", "Cry", "Sneeze", "Breath", "Cough", "Event_UNK")


@TOKENIZERS.register("sense_voice_bpe")
class SenseVoiceTokenizer(SentencePieceTokenizer):
    def __init__(self, path) -> None:
        super().__init__(path)
        self._kinds: dict[int, tuple[str, str]] = {}
        for kind, names in (("emotion", EMOTIONS), ("event", EVENTS)):
            for name in names:
                token = self.token_id(f"<|{name}|>")
                if token is not None:
                    self._kinds[token] = (kind, name)

    def audio_tags(self, token_ids: Sequence[int]) -> dict[str, str]:
        """The first emotion and the first event tag among ``token_ids``, by kind ({"emotion": "NEUTRAL",
        "event": "Speech"}); a kind the tokens hold no tag of is left out."""
        tags: dict[str, str] = {}
        for token in token_ids:
            kind = self._kinds.get(token)
            if kind is not None and kind[0] not in tags:
                tags[kind[0]] = kind[1]
        return tags
