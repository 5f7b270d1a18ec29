"""verbose_json's ``language`` is the language's name as OpenAI writes it ("english"), for every family's codes."""

from __future__ import annotations

import pytest
from transformers.models.whisper.tokenization_whisper import LANGUAGES as TRANSFORMERS_WHISPER_LANGUAGES

from oasr.models.qwen3_asr.languages import LANGUAGE_NAMES as QWEN3_LANGUAGES
from oasr.serving.languages import OPENAI_LANGUAGE_NAMES, openai_language_name
from oasr.serving.verbose import verbose_language


@pytest.mark.parametrize(("task", "detected", "requested", "written"), [
    ("transcribe", "en", None, "english"),  # Whisper, detected
    ("transcribe", None, "de", "german"),  # Canary: the language asked for
    ("transcribe", "hr", None, "croatian"),  # canary-1b-v2's European languages
    ("transcribe", "yue", None, "cantonese"),  # Qwen3-ASR
    ("transcribe", "fil", None, "filipino"),  # Qwen3-ASR, a code Whisper lacks
    ("transcribe", "xx", None, "xx"),  # unknown: passed through
    ("transcribe", None, None, ""),  # not known at all
    ("translate", "de", "de", "english"),  # OpenAI: a translation's language is always English
])
def test_verbose_json_names_the_language_as_openai_does(task, detected, requested, written) -> None:
    assert verbose_language(task, detected, requested) == written


def test_the_names_are_whispers_and_cover_every_qwen3_language() -> None:
    assert {k: OPENAI_LANGUAGE_NAMES[k] for k in TRANSFORMERS_WHISPER_LANGUAGES} == TRANSFORMERS_WHISPER_LANGUAGES
    assert all(openai_language_name(code) != code for code in QWEN3_LANGUAGES)
