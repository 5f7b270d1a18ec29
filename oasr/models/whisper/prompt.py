"""Whisper's decoder prompt and the options a checkpoint serves.

The prompt is ``[<|startofprev|> previous text...] <|sot|> [<|lang|> <|task|>] [<|notimestamps|>]``: the
previous text (a user's prompt, or the windows decoded before this one) is optional; language and task tokens
exist on multilingual checkpoints only; ``<|notimestamps|>`` is there unless the request decodes timestamps.
"""

from __future__ import annotations

from collections.abc import Sequence

from oasr.decode.aed_greedy import AEDGreedyOptions
from oasr.decode.timestamp_rules import TimestampTokens
from oasr.errors import UnsupportedOptionError
from oasr.models.base import Detection, Prompt
from oasr.models.whisper.config import WhisperConfig
from oasr.tokenizers.whisper import WhisperTokenizer
from oasr.types import DecodeOptions


class WhisperPrompter:
    """Whisper's ``PromptBuilder`` (``oasr.models.base``): its prompt, its language detection and its logit
    filters (suppress lists, openai-whisper's timestamp rules)."""

    def __init__(self, config: WhisperConfig, tokenizer: WhisperTokenizer, name: str) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.name = name
        special = tokenizer.special
        languages = list(special.language_ids.items())[: config.num_languages]
        self.language_names = [n for n, _ in languages]
        self.language_token_ids = [i for _, i in languages]
        self.end_token = special.eot
        self.no_speech_token = special.no_speech
        self.filters = AEDGreedyOptions(
            eot=special.eot,
            vocab_size=config.vocab_size,
            suppress_tokens=config.suppress_tokens,
            begin_suppress_tokens=config.begin_suppress_tokens,
            timestamp_tokens=TimestampTokens(eot=special.eot, no_timestamps=special.no_timestamps,
                                             timestamp_begin=special.timestamp_begin),
        )
        # As openai-whisper: the previous text fills at most half the decoder's positions, <|startofprev|> included.
        self.max_previous_tokens = config.max_target_positions // 2 - 1

    def check(self, options: DecodeOptions) -> None:
        """Refuses what this checkpoint cannot do, naming the option."""
        bad = [t for t in options.prompt_token_ids if not 0 <= t < self.config.vocab_size]
        if bad:
            raise UnsupportedOptionError(f"prompt token ids outside {self.name}'s vocabulary: {bad[:5]}")
        if not self.config.is_multilingual:
            if options.language not in (None, "en"):
                raise UnsupportedOptionError(f"{self.name} is English-only; language {options.language!r} is not available")
            if options.task == "translate":
                raise UnsupportedOptionError(f"{self.name} is English-only and cannot translate")
            return
        if options.language is not None and options.language not in self.language_names:
            self.tokenizer.language_id(options.language)  # unknown code: raises with the known list
            raise UnsupportedOptionError(f"{self.name} does not know language {options.language!r}")
        self.tokenizer.task_id(options.task)

    def needs_detection(self, options: DecodeOptions) -> bool:
        return self.config.is_multilingual and options.language is None

    def detection(self, options: DecodeOptions) -> Detection | None:
        """openai-whisper's ``detect_language``: the likeliest language token after ``<|startoftranscript|>``."""
        if not self.needs_detection(options):
            return None
        return Detection((self.tokenizer.special.sot,), tuple(self.language_token_ids), tuple(self.language_names))

    def language(self, options: DecodeOptions, detected: str | None) -> str | None:
        if not self.config.is_multilingual:
            return "en"
        return options.language if options.language is not None else detected

    def output_language(self, language: str | None, token_ids: Sequence[int]) -> str | None:
        return language  # the language is known before decoding (given or detected)

    def previous_tokens(self, options: DecodeOptions) -> list[int]:
        """The text to condition on, as token ids, cut to the newest ``max_previous_tokens``."""
        if options.prompt:
            ids = self.tokenizer.encode(" " + options.prompt.strip())
        else:
            ids = list(options.prompt_token_ids)
        return ids[-self.max_previous_tokens :] if ids else []

    def prompt_len(self, options: DecodeOptions, num_audio_positions: int = 0) -> int:
        return len(self.prompt(options, None).token_ids)

    def prompt(self, options: DecodeOptions, detected: str | None, num_audio_positions: int = 0) -> Prompt:
        """The prompt of a request, in the language given or ``detected`` (ignored on English-only models); the
        no-speech probability is read after ``<|startoftranscript|>``."""
        language = options.language if options.language is not None else detected
        s = self.tokenizer.special
        previous = self.previous_tokens(options)
        head = [s.sot_prev, *previous] if previous else []
        sot = [s.sot]
        if self.config.is_multilingual:
            sot += [self.tokenizer.language_id(language or "en"), self.tokenizer.task_id(options.task)]
        tail = [] if options.timestamps else [s.no_timestamps]
        return Prompt(token_ids=tuple(head + sot + tail), no_speech_index=len(head))
