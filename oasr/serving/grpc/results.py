"""OASR's results as Riva's messages: a transcription as a ``RecognizeResponse``, streamed text as
``StreamingRecognitionResult``s. Times go out in milliseconds (``WordInfo``), audio processed in seconds."""

from __future__ import annotations

import math

from oasr.serving.grpc.protos import riva_asr_pb2
from oasr.transcription.results import DecodedWindow
from oasr.types import Transcription

# Streamed text is never revised once sent (a transducer's tokens are final; an offline turn's interim text is
# what its decode has kept), so interim results say so.
STABLE = 1.0


def recognize_response(transcription: Transcription, windows: list[DecodedWindow], *, words: bool,
                       language_code: str) -> riva_asr_pb2.RecognizeResponse:
    """One result with one alternative: the whole transcript (as the HTTP route's ``text``), and its words with
    their offsets and probabilities when asked."""
    word_infos = [riva_asr_pb2.WordInfo(word=w.word.strip(), start_time=round(w.start * 1000),
                                        end_time=round(w.end * 1000), confidence=w.probability,
                                        language_code=language_code)
                  for window in windows for w in window.words] if words else []
    alternative = riva_asr_pb2.SpeechRecognitionAlternative(
        transcript=transcription.text, confidence=_confidence(transcription, word_infos), words=word_infos,
        language_code=[language_code or transcription.language or ""])
    result = riva_asr_pb2.SpeechRecognitionResult(alternatives=[alternative], channel_tag=1,
                                                  audio_processed=transcription.duration_s)
    return riva_asr_pb2.RecognizeResponse(results=[result] if transcription.text else [])


def _confidence(transcription: Transcription, words: list[riva_asr_pb2.WordInfo]) -> float:
    """The words' mean probability; without words, the segments' mean per-token probability
    (exp of their average log-probability) where the decode reported it; else 0 (unknown)."""
    if words:
        return sum(w.confidence for w in words) / len(words)
    logprobs = [s.avg_logprob for s in transcription.segments if s.avg_logprob is not None]
    return math.exp(sum(logprobs) / len(logprobs)) if logprobs else 0.0


def streaming_response(text: str, *, final: bool, audio_processed_s: float,
                       language_code: str) -> riva_asr_pb2.StreamingRecognizeResponse:
    alternative = riva_asr_pb2.SpeechRecognitionAlternative(transcript=text, language_code=[language_code])
    result = riva_asr_pb2.StreamingRecognitionResult(alternatives=[alternative], is_final=final,
                                                     stability=1.0 if final else STABLE, channel_tag=1,
                                                     audio_processed=audio_processed_s)
    return riva_asr_pb2.StreamingRecognizeResponse(results=[result])
