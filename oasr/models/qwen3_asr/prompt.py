"""Qwen3-ASR's chat prompt, built from ``DecodeOptions``:

    <|im_start|>system\\n{context}<|im_end|>\\n<|im_start|>user\\n<|audio_start|><|audio_pad|> x N<|audio_end|>
    <|im_end|>\\n<|im_start|>assistant\\n[language {Name}<asr_text>]

``context`` is ``DecodeOptions.prompt`` (hotwords, domain text; empty by default), N the request's audio positions,
whose embeddings the encoder's output replaces (``Prompt.audio_index``). A given ``DecodeOptions.language`` forces
the language by ending the prompt with the head the model would otherwise write itself. The text between the
special tokens is tokenized segment by segment, as a tokenizer that splits on added tokens first does with the
whole string; the special tokens are placed by id, looked up by name, so text in ``context`` never becomes one.
"""

from __future__ import annotations

from collections.abc import Sequence

from oasr.decode.aed_greedy import AEDGreedyOptions
from oasr.errors import CheckpointError, UnsupportedOptionError
from oasr.models.base import Detection, Prompt
from oasr.models.qwen3_asr.languages import LANGUAGE_CODES, LANGUAGE_NAMES
from oasr.tokenizers.qwen3_asr import ASR_TEXT, Qwen3ASRTokenizer
from oasr.types import DecodeOptions

_SPECIALS = ("<|im_start|>", "<|im_end|>", "<|audio_start|>", "<|audio_pad|>", "<|audio_end|>", ASR_TEXT)


class Qwen3ASRPrompter:
    """The ``PromptBuilder`` (``oasr.models.base``) of one checkpoint. No pre-pass (the model names the language
    in its output), no no-speech token; the only logit filter is the minimum-length bound on the end tokens
    (``<|im_end|>`` and the checkpoint's other ``eos_token_id``s)."""

    no_speech_token = None

    def __init__(self, tokenizer: Qwen3ASRTokenizer, name: str, *, vocab_size: int, audio_token_id: int,
                 eos_token_ids: Sequence[int] = ()) -> None:
        self.tokenizer = tokenizer
        self.name = name
        ids = {}
        for token in _SPECIALS:
            ids[token] = tokenizer.token_id(token)
            if ids[token] is None:
                raise CheckpointError(f"{name}: the vocabulary has no prompt token {token!r}")
        if ids["<|audio_pad|>"] != audio_token_id:
            raise CheckpointError(f"{name}: <|audio_pad|> is id {ids['<|audio_pad|>']} in the vocabulary but "
                                  f"{audio_token_id} in config.json (audio_token_id)")
        self.ids = ids
        self.end_token = ids["<|im_end|>"]
        # The checkpoint's other end tokens (<|endoftext|> beside <|im_end|>) end a request too, as in generate.
        stops = tuple(t for t in eos_token_ids if t != self.end_token)
        self.filters = AEDGreedyOptions(eot=self.end_token, vocab_size=vocab_size, stop_tokens=stops)

    def check(self, options: DecodeOptions) -> None:
        """Refuses options this prompt cannot express, naming the option."""
        if options.task != "transcribe":
            raise UnsupportedOptionError(f"{self.name} transcribes only (task {options.task!r})")
        if options.language is not None and options.language not in LANGUAGE_NAMES:
            raise UnsupportedOptionError(f"{self.name} does not know language={options.language!r}; it knows: "
                                         f"{', '.join(LANGUAGE_NAMES)}")
        if options.timestamps:
            raise UnsupportedOptionError(f"{self.name}: timestamps are not supported")
        if options.prompt_token_ids:
            raise UnsupportedOptionError(f"{self.name}: a context is given as text (prompt), not as token ids")

    def _parts(self, options: DecodeOptions, num_audio_positions: int) -> tuple[list[int], list[int]]:
        """(the ids before the audio positions, the ids after them)."""
        s, encode = self.ids, self.tokenizer.encode
        head = [s["<|im_start|>"], *encode("system\n" + (options.prompt or "")), s["<|im_end|>"], *encode("\n"),
                s["<|im_start|>"], *encode("user\n"), s["<|audio_start|>"]]
        assistant = "assistant\n"
        if options.language is not None:
            assistant += f"language {LANGUAGE_NAMES[options.language]}"
        tail = [s["<|audio_end|>"], s["<|im_end|>"], *encode("\n"), s["<|im_start|>"], *encode(assistant)]
        if options.language is not None:
            tail.append(s[ASR_TEXT])
        return head, tail

    def prompt_len(self, options: DecodeOptions, num_audio_positions: int = 0) -> int:
        head, tail = self._parts(options, num_audio_positions)
        return len(head) + num_audio_positions + len(tail)

    def detection(self, options: DecodeOptions) -> Detection | None:
        return None

    def prompt(self, options: DecodeOptions, detected: str | None, num_audio_positions: int = 0) -> Prompt:
        self.check(options)
        head, tail = self._parts(options, num_audio_positions)
        audio = [self.ids["<|audio_pad|>"]] * num_audio_positions
        return Prompt(tuple(head + audio + tail), audio_index=len(head))

    def language(self, options: DecodeOptions, detected: str | None) -> str | None:
        return options.language

    def output_language(self, language: str | None, token_ids: Sequence[int]) -> str | None:
        """The language a finished request is reported in: the forced one, else the code of the name the model
        wrote (None for ``language None`` or a name outside ``LANGUAGE_NAMES``)."""
        if language is not None:
            return language
        name = self.tokenizer.spoken_language(token_ids)
        return None if name is None else LANGUAGE_CODES.get(name.lower())
