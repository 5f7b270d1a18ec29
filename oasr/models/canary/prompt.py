"""The multitask decoder prompt of Canary and Cohere Transcribe, built from ``DecodeOptions``.

    [prefix...] <|startofcontext|> <|startoftranscript|> <|emo:undefined|> <|SRC|> <|TGT|> <|pnc|>|<|nopnc|>
    <|noitn|> <|notimestamp|> <|nodiarize|>

as transformers' Canary chat template renders it (its processor tests pin this string) and as
``CohereAsrProcessor.get_decoder_prompt_ids`` lists it, there after a leading ``▁`` (the prefix). SRC is the spoken
language, TGT the one to write: the target language, else English for ``task="translate"``, else SRC. Every token
is looked up by name in the checkpoint's vocabulary; none has a fixed id.
"""

from __future__ import annotations

from collections.abc import Sequence

from oasr.decode.aed_greedy import AEDGreedyOptions
from oasr.errors import CheckpointError, UnsupportedOptionError
from oasr.models.base import Detection, Prompt
from oasr.tokenizers.hf_json import HFJsonTokenizer
from oasr.types import DecodeOptions

_HEAD = ("<|startofcontext|>", "<|startoftranscript|>", "<|emo:undefined|>")
# Inverse text normalisation, timestamps and speaker turns are left off: the engine decodes none of them.
_TAIL = ("<|noitn|>", "<|notimestamp|>", "<|nodiarize|>")
_PUNCTUATION = {True: "<|pnc|>", False: "<|nopnc|>"}
_TRANSLATION_TARGET = "en"  # where ``task="translate"`` goes when no target language is named
_END = "<|endoftext|>"


class CanaryPrompter:
    """The ``PromptBuilder`` (``oasr.models.base``) of one checkpoint: options -> prompt ids. ``prefix``: token
    names before ``<|startofcontext|>``; ``translates``: whether the target may differ from the source;
    ``default_language``: the source language a request without one gets (None: requests must name it);
    ``vocab_size``: the decoder's output size. No pre-pass (the language is given), no no-speech token, and no
    logit filter but the minimum-length bound on end-of-text."""

    no_speech_token = None

    def __init__(
        self,
        tokenizer: HFJsonTokenizer,
        name: str,
        *,
        prefix: tuple[str, ...] = (),
        translates: bool = True,
        default_language: str | None = None,
        vocab_size: int | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.name = name
        self.translates = translates
        self.default_language = default_language
        self.language_ids = tokenizer.language_ids
        self.languages = tuple(self.language_ids)
        resolve = self._require
        self.head_ids = tuple(resolve(t) for t in (*prefix, *_HEAD))
        self.tail_ids = tuple(resolve(t) for t in _TAIL)
        self.punctuation_ids = {flag: resolve(t) for flag, t in _PUNCTUATION.items()}
        self.end_token = resolve(_END)
        self.filters = AEDGreedyOptions(eot=self.end_token, vocab_size=vocab_size or tokenizer.vocab_size)
        if default_language is not None and default_language not in self.language_ids:
            raise CheckpointError(f"{name}: default language {default_language!r} is not in its vocabulary")

    def _require(self, token: str) -> int:
        token_id = self.tokenizer.token_id(token)
        if token_id is None:
            raise CheckpointError(f"{self.name}: the vocabulary has no prompt token {token!r}")
        return token_id

    def _language_id(self, option: str, language: str) -> int:
        if language not in self.language_ids:
            raise UnsupportedOptionError(
                f"{self.name} does not know {option}={language!r}; it knows: {', '.join(self.languages)}"
            )
        return self.language_ids[language]

    def languages_of(self, options: DecodeOptions) -> tuple[str, str]:
        """(source, target) language codes of a request; refuses what this checkpoint cannot do, naming the option."""
        if options.task not in ("transcribe", "translate"):
            raise UnsupportedOptionError(f"unknown task {options.task!r}; choose transcribe or translate")
        source = options.language or self.default_language
        if source is None:
            raise UnsupportedOptionError(
                f"{self.name} needs language= (it does not detect the spoken language); "
                f"one of: {', '.join(self.languages)}"
            )
        self._language_id("language", source)
        target = options.target_language
        if target is None:
            target = _TRANSLATION_TARGET if options.task == "translate" else source
        self._language_id("target_language", target)
        if target != source and not self.translates:
            raise UnsupportedOptionError(
                f"{self.name} transcribes only: target_language={target!r} (task={options.task!r}) differs from "
                f"language={source!r}"
            )
        return source, target

    def check(self, options: DecodeOptions) -> None:
        """Refuses options this prompt cannot express, naming the option."""
        self.languages_of(options)
        if options.timestamps:
            raise UnsupportedOptionError(f"{self.name}: timestamps are not supported")
        if options.prompt is not None or options.prompt_token_ids:
            raise UnsupportedOptionError(f"{self.name}: prompt (text to condition on) is not supported")

    def prompt_ids(self, options: DecodeOptions) -> tuple[int, ...]:
        self.check(options)
        source, target = self.languages_of(options)
        languages = (self.language_ids[source], self.language_ids[target])
        return (*self.head_ids, *languages, self.punctuation_ids[options.punctuation], *self.tail_ids)

    def prompt_len(self, options: DecodeOptions, num_audio_positions: int = 0) -> int:
        return len(self.prompt_ids(options))

    def detection(self, options: DecodeOptions) -> Detection | None:
        return None

    def prompt(self, options: DecodeOptions, detected: str | None, num_audio_positions: int = 0) -> Prompt:
        return Prompt(self.prompt_ids(options))

    def language(self, options: DecodeOptions, detected: str | None) -> str | None:
        return self.languages_of(options)[0]

    def output_language(self, language: str | None, token_ids: Sequence[int]) -> str | None:
        return language  # the language is known before decoding (given or detected)
