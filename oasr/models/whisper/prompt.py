"""Whisper's decoder prompt (``<|sot|> [<|lang|> <|task|>] <|notimestamps|>``) and the options a checkpoint serves."""

from __future__ import annotations

from oasr.errors import UnsupportedOptionError
from oasr.models.whisper.config import WhisperConfig
from oasr.tokenizers.whisper import WhisperTokenizer
from oasr.types import DecodeOptions


class WhisperPrompter:
    def __init__(self, config: WhisperConfig, tokenizer: WhisperTokenizer, name: str) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.name = name
        special = tokenizer.special
        languages = list(special.language_ids.items())[: config.num_languages]
        self.language_names = [n for n, _ in languages]
        self.language_token_ids = [i for _, i in languages]

    @property
    def prompt_len(self) -> int:
        return 4 if self.config.is_multilingual else 2

    def check(self, options: DecodeOptions) -> None:
        """Refuses what this checkpoint cannot do, naming the option."""
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

    def prompt(self, language: str | None, task: str) -> list[int]:
        s = self.tokenizer.special
        if not self.config.is_multilingual:
            return [s.sot, s.no_timestamps]
        return [s.sot, self.tokenizer.language_id(language or "en"), self.tokenizer.task_id(task), s.no_timestamps]
