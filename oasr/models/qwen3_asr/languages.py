"""The languages Qwen3-ASR is forced to by name (``language English<asr_text>``), by ISO 639 code: the names the
model was trained with, which are also what it writes when it detects the language itself."""

from __future__ import annotations

LANGUAGE_NAMES: dict[str, str] = {
    "ar": "Arabic", "yue": "Cantonese", "zh": "Chinese", "cs": "Czech", "da": "Danish", "nl": "Dutch",
    "en": "English", "fil": "Filipino", "fi": "Finnish", "fr": "French", "de": "German", "el": "Greek",
    "hi": "Hindi", "hu": "Hungarian", "id": "Indonesian", "it": "Italian", "ja": "Japanese", "ko": "Korean",
    "mk": "Macedonian", "ms": "Malay", "fa": "Persian", "pl": "Polish", "pt": "Portuguese", "ro": "Romanian",
    "ru": "Russian", "es": "Spanish", "sv": "Swedish", "th": "Thai", "tr": "Turkish", "vi": "Vietnamese",
}  # fmt: skip
LANGUAGE_CODES: dict[str, str] = {name.lower(): code for code, name in LANGUAGE_NAMES.items()}
