"""openai-whisper's tests of a decoded window: whether to decode it again hotter, and whether it is silence."""

from __future__ import annotations

from oasr.types import FallbackOptions

HIGH_TEMPERATURE = 0.5  # text decoded above this is not fed to the next window as a prompt


def needs_fallback(fallback: FallbackOptions, ratio: float, avg_logprob: float, no_speech_prob: float) -> bool:
    """openai-whisper's test of a decoded window: too repetitive, or too improbable unless it is silence."""
    too_repetitive = fallback.compression_ratio_threshold is not None and ratio > fallback.compression_ratio_threshold
    improbable = fallback.logprob_threshold is not None and avg_logprob < fallback.logprob_threshold
    # Improbable text where <|nospeech|> is likely is silence, not a failure: no retry, whatever its text.
    silent = improbable and fallback.no_speech_threshold is not None and no_speech_prob > fallback.no_speech_threshold
    return (too_repetitive or improbable) and not silent


def is_silence(fallback: FallbackOptions, avg_logprob: float, no_speech_prob: float) -> bool:
    """<|nospeech|> is likely and the text is not confident enough to overrule it."""
    if fallback.no_speech_threshold is None or no_speech_prob <= fallback.no_speech_threshold:
        return False
    return fallback.logprob_threshold is None or avg_logprob <= fallback.logprob_threshold
