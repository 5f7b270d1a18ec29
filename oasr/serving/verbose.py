"""The timestamped parts of ``response_format=verbose_json``: segments (decoding windows, or spans closed by
timestamp tokens) and words."""

from __future__ import annotations

import zlib

from oasr.audio import SAMPLE_RATE
from oasr.serving.languages import openai_language_name
from oasr.serving.protocol import VerboseSegment, VerboseWord
from oasr.transcription.results import DecodedWindow
from oasr.types import DecodeOptions, Segment, Task

SAMPLES_PER_FRAME = SAMPLE_RATE // 100  # Whisper's 10 ms feature frames, in which ``seek`` counts


def verbose_segments(tokenizer, windows: list[DecodedWindow], options: DecodeOptions) -> list[VerboseSegment]:
    """Segments from timestamp tokens when the windows were decoded with them, else one per window with text."""
    if options.timestamps:
        pairs = ((w, seg) for w in windows for seg in w.segments)
        return [_timestamped_segment(i, w, seg, tokenizer.decode(list(seg.token_ids)), options.temperature)
                for i, (w, seg) in enumerate(pairs)]
    return [_window_segment(i, w, options.temperature) for i, w in enumerate(w for w in windows if w.text.strip())]


def verbose_language(task: Task, detected: str | None, requested: str | None) -> str:
    """``language`` as OpenAI writes it, by name ("english"): a translation's is its output's (OpenAI: always
    English), a transcription's the audio's (detected, else the one asked for; "" when neither is known)."""
    code = "en" if task == "translate" else detected or requested or ""
    return openai_language_name(code) if code else ""


def verbose_words(windows: list[DecodedWindow]) -> list[VerboseWord]:
    """Every window's words in order, stripped of their leading space as OpenAI's are."""
    return [VerboseWord(word=w.word.strip(), start=w.start, end=w.end) for window in windows for w in window.words]


def _window_segment(segment_id: int, window: DecodedWindow, temperature: float) -> VerboseSegment:
    """A window decoded without timestamps, as one segment: its one text segment carries what the engine
    measured over the window (None where the model does not report it)."""
    text_bytes = window.text.encode("utf-8")
    measured = window.segments[0] if window.segments else None
    return VerboseSegment(
        id=segment_id,
        seek=window.start_sample // SAMPLES_PER_FRAME,
        start=window.start_s,
        end=window.end_s,
        text=window.text,
        tokens=window.token_ids,
        temperature=temperature,  # the request's: there is no temperature fallback
        avg_logprob=measured.avg_logprob if measured else None,
        compression_ratio=len(text_bytes) / len(zlib.compress(text_bytes)),  # as Whisper computes it
        no_speech_prob=measured.no_speech_prob if measured else None,
    )


def _timestamped_segment(segment_id: int, window: DecodedWindow, segment: Segment, text: str,
                         temperature: float) -> VerboseSegment:
    """A segment closed by timestamp tokens, with the decoding details of its window; ``text`` as decoded
    (leading space kept, as Whisper's segments do)."""
    return VerboseSegment(
        id=segment_id,
        seek=window.start_sample // SAMPLES_PER_FRAME,
        start=segment.start,
        end=segment.end,
        text=text,
        tokens=list(segment.token_ids),
        temperature=temperature,
        avg_logprob=segment.avg_logprob,
        compression_ratio=segment.compression_ratio,
        no_speech_prob=segment.no_speech_prob,
    )
