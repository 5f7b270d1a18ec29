"""Granite Speech's transcription prompt, its chat template with the model card's request:

    <|start_of_role|>system<|end_of_role|>{system}<|end_of_text|>
    <|start_of_role|>user<|end_of_role|><|audio|> x N can you transcribe the speech into a written format?<|end_of_text|>
    <|start_of_role|>assistant<|end_of_role|>

(a newline after each ``<|end_of_text|>``). N is the request's audio positions (``Prompt.audio_index``); the system
text is the model card's without its date line, so that a request's tokens do not change from day to day. The
request names no language and takes no context: a language, a task other than transcription, timestamps and a
prompt are refused, each naming the option.
"""

from __future__ import annotations

from collections.abc import Sequence

from oasr.decode.aed_greedy import AEDGreedyOptions
from oasr.errors import CheckpointError, UnsupportedOptionError
from oasr.models.base import Detection, Prompt
from oasr.types import DecodeOptions

SYSTEM = ("Knowledge Cutoff Date: April 2024.\n"
          "You are Granite, developed by IBM. You are a helpful AI assistant")
REQUEST = "can you transcribe the speech into a written format?"
_SPECIALS = ("<|start_of_role|>", "<|end_of_role|>", "<|end_of_text|>", "<|audio|>")


class GraniteSpeechPrompter:
    """The ``PromptBuilder`` (``oasr.models.base``) of one checkpoint: no pre-pass, no no-speech token; the
    minimum-length bound on ``<|end_of_text|>`` and the checkpoint's other ``eos_token_id``s."""

    no_speech_token = None

    def __init__(self, tokenizer, name: str, *, vocab_size: int, audio_token_id: int,
                 eos_token_ids: Sequence[int] = ()) -> None:
        self.tokenizer = tokenizer
        self.name = name
        ids = {}
        for token in _SPECIALS:
            ids[token] = tokenizer.token_id(token)
            if ids[token] is None:
                raise CheckpointError(f"{name}: the vocabulary has no prompt token {token!r}")
        if ids["<|audio|>"] != audio_token_id:
            raise CheckpointError(f"{name}: <|audio|> is id {ids['<|audio|>']} in the vocabulary but "
                                  f"{audio_token_id} in config.json (audio_token_index)")
        self.ids = ids
        self.end_token = ids["<|end_of_text|>"]
        stops = tuple(t for t in eos_token_ids if t != self.end_token)
        self.filters = AEDGreedyOptions(eot=self.end_token, vocab_size=vocab_size, stop_tokens=stops)
        s, encode = ids, tokenizer.encode
        self._head = [s["<|start_of_role|>"], *encode("system"), s["<|end_of_role|>"], *encode(SYSTEM),
                      s["<|end_of_text|>"], *encode("\n"), s["<|start_of_role|>"], *encode("user"),
                      s["<|end_of_role|>"]]
        self._tail = [*encode(REQUEST), s["<|end_of_text|>"], *encode("\n"), s["<|start_of_role|>"],
                      *encode("assistant"), s["<|end_of_role|>"]]

    def check(self, options: DecodeOptions) -> None:
        """Refuses options this prompt cannot express, naming the option."""
        if options.task != "transcribe":
            raise UnsupportedOptionError(f"{self.name} transcribes only (task {options.task!r})")
        if options.language is not None:
            raise UnsupportedOptionError(f"{self.name}: its transcription request names no language "
                                         f"(language={options.language!r})")
        if options.timestamps:
            raise UnsupportedOptionError(f"{self.name}: timestamps are not supported")
        if options.prompt is not None or options.prompt_token_ids:
            raise UnsupportedOptionError(f"{self.name}: its transcription request takes no prompt")

    def prompt_len(self, options: DecodeOptions, num_audio_positions: int = 0) -> int:
        return len(self._head) + num_audio_positions + len(self._tail)

    def detection(self, options: DecodeOptions) -> Detection | None:
        return None

    def prompt(self, options: DecodeOptions, detected: str | None, num_audio_positions: int = 0) -> Prompt:
        self.check(options)
        audio = [self.ids["<|audio|>"]] * num_audio_positions
        return Prompt(tuple(self._head + audio + self._tail), audio_index=len(self._head))

    def language(self, options: DecodeOptions, detected: str | None) -> str | None:
        return None

    def output_language(self, language: str | None, token_ids: Sequence[int]) -> str | None:
        return None
