"""Qwen2-Audio's speech-recognition prompt (the base model's, as its model card and evaluation scripts give it):

    <|audio_bos|><|AUDIO|> x N<|audio_eos|>Detect the language and recognize the speech: [<|en|>]

N is the request's audio positions (``Prompt.audio_index``), which the processor's ``<|AUDIO|>`` expansion also
counts. A forced ``DecodeOptions.language`` ends the prompt with that language's token; without one the model
writes the token itself before the transcript, and the request is reported in the language it names. Special
tokens are placed by id, looked up by name; the instruction text between them is tokenized on its own, as a
tokenizer that splits on added tokens first does with the whole string.
"""

from __future__ import annotations

from collections.abc import Sequence

from oasr.decode.aed_greedy import AEDGreedyOptions
from oasr.errors import CheckpointError, UnsupportedOptionError
from oasr.models.base import Detection, Prompt
from oasr.types import DecodeOptions

INSTRUCTION = "Detect the language and recognize the speech: "
_SPECIALS = ("<|endoftext|>", "<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>")


class Qwen2AudioPrompter:
    """The ``PromptBuilder`` (``oasr.models.base``) of one checkpoint: no pre-pass, no no-speech token; the
    minimum-length bound on ``<|endoftext|>`` and the checkpoint's other ``eos_token_id``s."""

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
        if ids["<|AUDIO|>"] != audio_token_id:
            raise CheckpointError(f"{name}: <|AUDIO|> is id {ids['<|AUDIO|>']} in the vocabulary but "
                                  f"{audio_token_id} in config.json (audio_token_index)")
        self.ids = ids
        self.languages: dict[str, int] = dict(tokenizer.language_ids)  # <|en|> ... by code
        self._codes = {i: code for code, i in self.languages.items()}
        self.end_token = ids["<|endoftext|>"]
        stops = tuple(t for t in eos_token_ids if t != self.end_token)
        self.filters = AEDGreedyOptions(eot=self.end_token, vocab_size=vocab_size, stop_tokens=stops)

    def check(self, options: DecodeOptions) -> None:
        """Refuses options this prompt cannot express, naming the option."""
        if options.task != "transcribe":
            raise UnsupportedOptionError(f"{self.name} transcribes only (task {options.task!r})")
        if options.language is not None and options.language not in self.languages:
            raise UnsupportedOptionError(f"{self.name} does not know language={options.language!r}; it knows: "
                                         f"{', '.join(self.languages)}")
        if options.timestamps:
            raise UnsupportedOptionError(f"{self.name}: timestamps are not supported")
        if options.prompt is not None or options.prompt_token_ids:
            raise UnsupportedOptionError(f"{self.name}: its recognition prompt takes no context (prompt)")

    def _parts(self, options: DecodeOptions) -> tuple[list[int], list[int]]:
        tail = [self.ids["<|audio_eos|>"], *self.tokenizer.encode(INSTRUCTION)]
        if options.language is not None:
            tail.append(self.languages[options.language])
        return [self.ids["<|audio_bos|>"]], tail

    def prompt_len(self, options: DecodeOptions, num_audio_positions: int = 0) -> int:
        head, tail = self._parts(options)
        return len(head) + num_audio_positions + len(tail)

    def detection(self, options: DecodeOptions) -> Detection | None:
        return None

    def prompt(self, options: DecodeOptions, detected: str | None, num_audio_positions: int = 0) -> Prompt:
        self.check(options)
        head, tail = self._parts(options)
        return Prompt(tuple(head + [self.ids["<|AUDIO|>"]] * num_audio_positions + tail), audio_index=len(head))

    def language(self, options: DecodeOptions, detected: str | None) -> str | None:
        return options.language

    def output_language(self, language: str | None, token_ids: Sequence[int]) -> str | None:
        """The forced language, else the one whose token the model wrote first (None without one)."""
        if language is not None:
            return language
        return self._codes.get(token_ids[0]) if token_ids else None
