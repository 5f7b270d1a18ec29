"""Voxtral's transcription request, as mistral-common's ``encode_transcription`` builds it (the tokens transformers'
``VoxtralProcessor.apply_transcription_request`` hands to ``generate``):

    <s>[INST][BEGIN_AUDIO][AUDIO] x N[/INST][lang:{code}][TRANSCRIBE]

N is the request's audio positions (375 per 30 s window), whose embeddings the encoder's output replaces
(``Prompt.audio_index``). ``lang:{code}`` (plain text, no space) is there when ``DecodeOptions.language`` forces
the language; without it the model hears the language itself and writes the transcript alone, so the language is
then reported as unknown. The control tokens are placed by id, looked up by their names in ``tekken.json``.

The transcription request has no task, context or timestamps: translation is an instruction in Voxtral's chat
mode, not a transcription request, so ``task="translate"`` is refused, as are a prompt and timestamps.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from oasr.decode.aed_greedy import AEDGreedyOptions
from oasr.errors import CheckpointError, UnsupportedOptionError
from oasr.models.base import Detection, Prompt
from oasr.types import DecodeOptions

_SPECIALS = ("<s>", "</s>", "[INST]", "[/INST]", "[BEGIN_AUDIO]", "[AUDIO]", "[TRANSCRIBE]")
# mistral-common takes the language as an ISO 639-1 code (pydantic's LanguageAlpha2).
_LANGUAGE_CODE = re.compile(r"^[a-z]{2}$")


class VoxtralPrompter:
    """The ``PromptBuilder`` (``oasr.models.base``) of one checkpoint. No pre-pass, no no-speech token; the only
    logit filter is the minimum-length bound on ``</s>`` (and the checkpoint's other ``eos_token_id``s)."""

    no_speech_token = None

    def __init__(self, tokenizer, name: str, *, vocab_size: int, audio_token_id: int,
                 eos_token_ids: Sequence[int] = ()) -> None:
        self.tokenizer = tokenizer
        self.name = name
        ids = {}
        for token in _SPECIALS:
            ids[token] = tokenizer.token_id(token)
            if ids[token] is None:
                raise CheckpointError(f"{name}: the vocabulary has no control token {token!r}")
        if ids["[AUDIO]"] != audio_token_id:
            raise CheckpointError(f"{name}: [AUDIO] is id {ids['[AUDIO]']} in the vocabulary but {audio_token_id} "
                                  "in config.json (audio_token_id)")
        self.ids = ids
        self.end_token = ids["</s>"]
        stops = tuple(t for t in eos_token_ids if t != self.end_token)
        self.filters = AEDGreedyOptions(eot=self.end_token, vocab_size=vocab_size, stop_tokens=stops)

    def check(self, options: DecodeOptions) -> None:
        """Refuses options a transcription request cannot express, naming the option."""
        if options.task != "transcribe":
            raise UnsupportedOptionError(f"{self.name} transcribes only (task {options.task!r}): Voxtral's "
                                         "transcription request has no translation")
        if options.language is not None and not _LANGUAGE_CODE.match(options.language):
            raise UnsupportedOptionError(f"{self.name}: language={options.language!r} is not an ISO 639-1 code "
                                         "(two lowercase letters, as en, fr)")
        if options.timestamps:
            raise UnsupportedOptionError(f"{self.name}: timestamps are not supported")
        if options.prompt is not None or options.prompt_token_ids:
            raise UnsupportedOptionError(f"{self.name}: a transcription request takes no prompt")

    def _parts(self, options: DecodeOptions) -> tuple[list[int], list[int]]:
        """(the ids before the audio positions, the ids after them)."""
        s = self.ids
        head = [s["<s>"], s["[INST]"], s["[BEGIN_AUDIO]"]]
        language = self.tokenizer.encode(f"lang:{options.language}") if options.language is not None else []
        return head, [s["[/INST]"], *language, s["[TRANSCRIBE]"]]

    def prompt_len(self, options: DecodeOptions, num_audio_positions: int = 0) -> int:
        head, tail = self._parts(options)
        return len(head) + num_audio_positions + len(tail)

    def detection(self, options: DecodeOptions) -> Detection | None:
        return None

    def prompt(self, options: DecodeOptions, detected: str | None, num_audio_positions: int = 0) -> Prompt:
        self.check(options)
        head, tail = self._parts(options)
        return Prompt(tuple(head + [self.ids["[AUDIO]"]] * num_audio_positions + tail), audio_index=len(head))

    def language(self, options: DecodeOptions, detected: str | None) -> str | None:
        return options.language

    def output_language(self, language: str | None, token_ids: Sequence[int]) -> str | None:
        """The forced language; None when the model chose (it does not name it in its output)."""
        return language
