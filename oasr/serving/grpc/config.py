"""A Riva ``RecognitionConfig`` read into OASR's terms, every field checked: what the request's audio is, the
decode options, whether words are wanted, and the endpointing of a stream. A field OASR cannot honour is refused
with INVALID_ARGUMENT naming it, never ignored (the one exception is automatic punctuation: Riva's
default is off, which a Riva client sends without asking for anything, so a model that always punctuates
(Whisper) keeps its punctuation rather than refusing every default request; a model that can leave it out
(Canary) does)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import grpc

from oasr.serving.grpc.protos import riva_asr_pb2, riva_audio_pb2
from oasr.serving.protocol import MAX_HOTWORDS_CHARS
from oasr.types import DEFAULT_HOTWORD_BOOST, SERVER_HOTWORD_BEAM_SIZE, DecodeOptions, Hotword

# Riva's own encoding names, by the enum's numbers.
LINEAR_PCM = riva_audio_pb2.LINEAR_PCM
FLAC = riva_audio_pb2.FLAC
MULAW = riva_audio_pb2.MULAW
OGGOPUS = riva_audio_pb2.OGGOPUS
ALAW = riva_audio_pb2.ALAW
# Raw sample formats (the rate and channels come from the config) and self-describing files (read from the bytes).
RAW_ENCODINGS = (LINEAR_PCM, MULAW, ALAW)
FILE_ENCODINGS = (FLAC, OGGOPUS)
MAX_CHANNELS = 8
MIN_RATE, MAX_RATE = 8_000, 192_000
# Riva's word-boosting scores (its documentation recommends 20 to 100) over OASR's hotword boost (natural-log
# score per token of a phrase, default 1.5): 20 -> 2.0, 100 -> 10.0. A context's boost 0 (unset) is OASR's default.
RIVA_BOOST_PER_OASR_BOOST = 10.0


class RivaError(Exception):
    """A call's failure as a gRPC status: ``code`` and a message for the client."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def invalid(field: str, message: str) -> RivaError:
    """INVALID_ARGUMENT, the message starting with the field's path as the request spells it."""
    return RivaError(grpc.StatusCode.INVALID_ARGUMENT, f"{field}: {message}")


@dataclass(frozen=True)
class AudioFormat:
    encoding: int  # a riva AudioEncoding number
    sample_rate: int  # of raw samples; 0 for a file, whose header says
    channels: int  # of raw samples, interleaved (averaged to mono)

    @property
    def raw(self) -> bool:
        return self.encoding in RAW_ENCODINGS


@dataclass(frozen=True)
class Endpointing:
    """Riva's ``EndpointingConfig`` as OASR reads it: ``stop_history_ms`` of silence ends an utterance (a VAD
    turn of an offline model, an endpoint of a streaming one); ``start_threshold`` is the speech probability
    that starts one (the VAD's threshold). None: the server's default."""

    stop_history_ms: int | None = None
    start_threshold: float | None = None


@dataclass(frozen=True)
class RecognitionRequest:
    audio: AudioFormat
    options: DecodeOptions
    word_time_offsets: bool
    endpointing: Endpointing
    language_code: str  # as the client sent it, echoed in results ("" when none)


# custom_configuration keys and the decode options they set, with how each value is read.
_CUSTOM_KEYS = {
    "task": ("task", str),
    "target_language": ("target_language", str),
    "prompt": ("prompt", str),
    "temperature": ("temperature", float),
    "beam_size": ("beam_size", int),
    "patience": ("patience", float),
    "length_penalty": ("length_penalty", float),
}


def language_of(code: str) -> str | None:
    """The model's language code for a BCP-47 tag: "en-US" -> "en"; "" or "multi" -> None (detect)."""
    code = code.strip()
    if not code or code.lower() in ("multi", "auto"):
        return None
    return code.replace("_", "-").split("-")[0].lower()


def read_config(config: riva_asr_pb2.RecognitionConfig, prefix: str, *, accepts_model, streaming: bool,
                can_align_words: bool, can_drop_punctuation: bool, takes_language: bool,
                hotwords_need_beam: bool = True) -> RecognitionRequest:
    """``config`` checked; ``prefix`` is its path in the request (``config`` or ``streaming_config.config``);
    ``accepts_model(name)`` says whether ``model`` names the served model. Speech contexts become hotwords, searched
    with ``SERVER_HOTWORD_BEAM_SIZE`` unless ``custom_configuration`` gives a beam_size or the model's hotwords
    need none (``hotwords_need_beam``). The engine's own checks (language, options the model refuses) come after,
    in ``service.check_options``."""
    audio = _audio_format(config, prefix, streaming)
    if config.model and not accepts_model(config.model):
        raise invalid(f"{prefix}.model", f"the model '{config.model[:128]}' is not served here; "
                      "GetRivaSpeechRecognitionConfig lists the one that is (or leave model empty)")
    if config.max_alternatives < 0:
        raise invalid(f"{prefix}.max_alternatives", f"must be >= 0, got {config.max_alternatives}")
    if config.profanity_filter:
        raise invalid(f"{prefix}.profanity_filter", "OASR has no profanity filter; leave it false")
    if config.diarization_config.enable_speaker_diarization:
        raise invalid(f"{prefix}.diarization_config", "speaker diarization is not supported by this server yet")
    if config.enable_separate_recognition_per_channel:
        raise invalid(f"{prefix}.enable_separate_recognition_per_channel",
                      "channels are mixed to mono; leave it false")
    if config.enable_word_time_offsets and not can_align_words:
        raise invalid(f"{prefix}.enable_word_time_offsets", "the served model gives no word timestamps")
    punctuation = config.enable_automatic_punctuation or not can_drop_punctuation
    # Riva clients always send a language ("en-US" by default). A model that takes one (Whisper, Canary) is told
    # it, and refuses one it does not speak; a model that takes none (a transducer) transcribes what it hears.
    language = language_of(config.language_code) if takes_language else None
    options = DecodeOptions(language=language, punctuation=punctuation)
    options = _custom_options(options, config, prefix)
    hotwords = _hotwords(config, prefix)
    if hotwords:
        beam = options.beam_size if options.beam_size is not None or not hotwords_need_beam else SERVER_HOTWORD_BEAM_SIZE
        options = replace(options, hotwords=hotwords, beam_size=beam)
    return RecognitionRequest(audio, options, config.enable_word_time_offsets, _endpointing(config, prefix),
                              config.language_code)


def _audio_format(config: riva_asr_pb2.RecognitionConfig, prefix: str, streaming: bool) -> AudioFormat:
    encoding = config.encoding
    known = (*RAW_ENCODINGS, *FILE_ENCODINGS)
    if encoding not in known:
        names = ", ".join(riva_audio_pb2.AudioEncoding.Name(e) for e in known)
        raise invalid(f"{prefix}.encoding", f"{_encoding_name(encoding)} is not an encoding this server reads; "
                      f"send one of {names}")
    if streaming and encoding not in RAW_ENCODINGS:
        raise invalid(f"{prefix}.encoding", f"a stream's audio must be raw samples (LINEAR_PCM, MULAW or ALAW), "
                      f"not {_encoding_name(encoding)}")
    if encoding not in RAW_ENCODINGS:
        return AudioFormat(encoding, 0, 1)
    if not MIN_RATE <= config.sample_rate_hertz <= MAX_RATE:
        raise invalid(f"{prefix}.sample_rate_hertz", f"raw samples need their rate, {MIN_RATE} to {MAX_RATE} Hz; "
                      f"got {config.sample_rate_hertz}")
    channels = config.audio_channel_count or 1
    if not 1 <= channels <= MAX_CHANNELS:
        raise invalid(f"{prefix}.audio_channel_count", f"must be 1 to {MAX_CHANNELS}, got {channels}")
    return AudioFormat(encoding, config.sample_rate_hertz, channels)


def _encoding_name(encoding: int) -> str:
    try:
        return riva_audio_pb2.AudioEncoding.Name(encoding)
    except ValueError:
        return f"encoding {encoding}"


def _custom_options(options: DecodeOptions, config: riva_asr_pb2.RecognitionConfig, prefix: str) -> DecodeOptions:
    """``custom_configuration`` key-values as decode options; an unknown key or unreadable value is refused."""
    values = {}
    for key, text in sorted(config.custom_configuration.items()):
        field = f"{prefix}.custom_configuration[{key[:64]}]"
        if key not in _CUSTOM_KEYS:
            raise invalid(field, f"unknown key; this server reads {', '.join(_CUSTOM_KEYS)}")
        name, kind = _CUSTOM_KEYS[key]
        try:
            value = kind(text)
        except ValueError:
            raise invalid(field, f"'{text[:64]}' is not a {kind.__name__}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise invalid(field, "must be a finite number")
        values[name] = value
    if values.get("task", "transcribe") not in ("transcribe", "translate"):
        raise invalid(f"{prefix}.custom_configuration[task]", "must be transcribe or translate")
    try:
        return replace(options, **values)
    except ValueError as exc:  # options that contradict each other (a beam with sampling)
        raise invalid(f"{prefix}.custom_configuration", str(exc)) from None


def _hotwords(config: riva_asr_pb2.RecognitionConfig, prefix: str) -> tuple[Hotword, ...]:
    """Every speech context's phrases as hotwords, each with its context's boost on OASR's scale
    (``RIVA_BOOST_PER_OASR_BOOST``); empty phrases are skipped, a list over the form field's size is refused."""
    hotwords, chars = [], 0
    for index, context in enumerate(config.speech_contexts):
        field = f"{prefix}.speech_contexts[{index}]"
        if not math.isfinite(context.boost):
            raise invalid(f"{field}.boost", "must be a finite number")
        boost = context.boost / RIVA_BOOST_PER_OASR_BOOST if context.boost else DEFAULT_HOTWORD_BOOST
        for phrase in context.phrases:
            chars += len(phrase)
            if chars > MAX_HOTWORDS_CHARS:
                raise invalid(f"{prefix}.speech_contexts", f"more than {MAX_HOTWORDS_CHARS} characters of phrases")
            if phrase.strip():
                try:
                    hotwords.append(Hotword(" ".join(phrase.split()), boost))
                except ValueError as exc:  # a boost no score scale explains
                    raise invalid(f"{field}.boost", str(exc)) from None
    return tuple(hotwords)


def _endpointing(config: riva_asr_pb2.RecognitionConfig, prefix: str) -> Endpointing:
    if not config.HasField("endpointing_config"):
        return Endpointing()
    given = config.endpointing_config
    field = f"{prefix}.endpointing_config"
    stop = given.stop_history if given.HasField("stop_history") else None
    if stop is not None and stop < 0:
        raise invalid(f"{field}.stop_history", f"must be >= 0 ms, got {stop}")
    threshold = given.start_threshold if given.HasField("start_threshold") else None
    if threshold is not None and not 0 < threshold <= 1:
        raise invalid(f"{field}.start_threshold", f"must be in (0, 1], got {threshold:g}")
    # Riva reads 0 (and -1) as "the default".
    return Endpointing(stop_history_ms=stop or None, start_threshold=threshold)
