"""Typed errors that user-facing layers (CLI, server) translate into clear messages."""

from __future__ import annotations


class OASRError(Exception):
    """Base class of every error OASR raises on purpose."""


class AudioDecodeError(OASRError):
    """An input could not be decoded into audio samples (unreadable, truncated, not audio, or empty)."""

    def __init__(self, source: str, reason: str) -> None:
        super().__init__(f"{source}: {reason}")
        self.source = source
        self.reason = reason


class AudioTooLongError(AudioDecodeError):
    """An input longer than the caller's limit, refused from its header or as soon as decoding passed the limit,
    so it is never decoded whole. ``length`` says what was seen ("the audio is 45.0 s long", "the file declares
    7200.0 s of audio"), for layers that word the limit their own way."""

    def __init__(self, source: str, length: str, max_seconds: float) -> None:
        super().__init__(source, f"{length}, over the limit of {max_seconds:g} s")
        self.length = length
        self.max_seconds = max_seconds


class ModelNotFoundError(OASRError):
    """A model name or path that resolves to no supported checkpoint."""


class CheckpointError(OASRError):
    """A checkpoint whose contents do not match what its converter expects."""


class UnsupportedOptionError(OASRError):
    """An option the loaded model cannot serve (for example a language on an English-only checkpoint)."""


class UnsupportedQuantizationError(OASRError):
    """A quantization method, spec, device or dtype that cannot be served (named in the message)."""


class HubUnavailableError(ModelNotFoundError):
    """A Hugging Face Hub model that cannot be had: an unknown repo or revision, a gated or private one without a
    token that may read it, no network, or offline mode with the files not in the cache. The message says which,
    and what to do."""


class UnsupportedModelError(ModelNotFoundError):
    """A checkpoint (on the Hub or on disk) in a format or of an architecture OASR does not serve; the message lists
    what it does serve."""


class TranscriptionFailedError(AudioDecodeError):
    """Some inputs of ``oasr.transcribe`` failed (without ``skip_errors``); raised once every input has run, so
    nothing is lost: ``results`` holds every input's result in input order (a failed one with ``error`` set),
    ``failures`` the failed ones. Names the first failure, as ``AudioDecodeError`` does."""

    def __init__(self, results: list, failures: list) -> None:
        first = failures[0]
        reason = first.error.removeprefix(f"{first.source}: ")
        if len(results) > 1:
            reason += (f" ({len(failures)} of {len(results)} inputs failed; this error's .results holds every "
                       "result, skip_errors=True returns them)")
        super().__init__(first.source, reason)
        self.results = results
        self.failures = failures
