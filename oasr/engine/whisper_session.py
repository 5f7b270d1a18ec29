"""One Whisper checkpoint ready to decode windows of audio: prompts, language detection, greedy decoding."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from oasr.decode.aed_greedy import AEDGreedyDecoder, AEDGreedyOptions
from oasr.errors import UnsupportedOptionError
from oasr.models.loader import LoadedModel
from oasr.types import TranscribeOptions


@dataclass(frozen=True)
class WindowResult:
    token_ids: list[int]
    language: str | None


class WhisperSession:
    """Decodes batches of <= 30 s windows with one loaded Whisper checkpoint."""

    def __init__(self, loaded: LoadedModel, options: TranscribeOptions) -> None:
        self.loaded = loaded
        self.options = options
        self.config = loaded.config
        self.special = loaded.tokenizer.special
        self._check_options()
        self.decoder = AEDGreedyDecoder(
            AEDGreedyOptions(
                eot=self.special.eot,
                vocab_size=self.config.vocab_size,
                max_length=options.max_length or self.config.max_target_positions,
                suppress_tokens=self.config.suppress_tokens,
                begin_suppress_tokens=self.config.begin_suppress_tokens,
            ),
            loaded.device,
        )
        languages = list(self.special.language_ids.items())[: self.config.num_languages]
        self._language_ids = torch.tensor([lid for _, lid in languages], device=loaded.device)
        self._language_names = [name for name, _ in languages]

    def _check_options(self) -> None:
        o = self.options
        if not self.config.is_multilingual:
            if o.language not in (None, "en"):
                raise UnsupportedOptionError(f"{self.loaded.name} is English-only; language {o.language!r} is not available")
            if o.task == "translate":
                raise UnsupportedOptionError(f"{self.loaded.name} is English-only and cannot translate")
        elif o.language is not None:
            self.loaded.tokenizer.language_id(o.language)  # raises on an unknown code

    def prompt(self, language: str | None) -> list[int]:
        s = self.special
        if not self.config.is_multilingual:
            return [s.sot, s.no_timestamps]
        tokenizer = self.loaded.tokenizer
        return [s.sot, tokenizer.language_id(language or "en"), tokenizer.task_id(self.options.task), s.no_timestamps]

    @torch.inference_mode()
    def detect_languages(self, encoder_out: torch.Tensor) -> list[str]:
        """Most likely language per row, from the decoder's first step after ``<|startoftranscript|>``."""
        model = self.loaded.model
        sot = torch.full((encoder_out.shape[0], 1), self.special.sot, device=encoder_out.device)
        logits = model.decode(sot, model.new_cache(encoder_out, max_positions=1), 0)[:, 0]
        best = logits[:, self._language_ids].argmax(dim=-1).tolist()
        return [self._language_names[i] for i in best]

    @torch.inference_mode()
    def decode_windows(self, windows: Sequence[np.ndarray]) -> list[WindowResult]:
        loaded = self.loaded
        features = loaded.features(windows, device=loaded.device)
        encoder_out = loaded.model.encode(features)
        if not self.config.is_multilingual:
            languages: list[str | None] = ["en"] * len(windows)
        elif self.options.language is not None:
            languages = [self.options.language] * len(windows)
        else:
            languages = list(self.detect_languages(encoder_out))
        prompts = torch.tensor([self.prompt(lang) for lang in languages], device=loaded.device)
        tokens = self.decoder.decode(loaded.model, encoder_out, prompts)
        return [WindowResult(ids, lang) for ids, lang in zip(tokens, languages, strict=True)]
