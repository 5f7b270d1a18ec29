"""Per-window results and their assembly into one ``Transcription`` (shared by offline runs and the server)."""

from __future__ import annotations

from dataclasses import dataclass

from oasr.audio import SAMPLE_RATE
from oasr.engine.segments import TokenSpan, compression_ratio, split_window, unfinished_tail
from oasr.types import Segment, Transcription


@dataclass(frozen=True)
class DecodedWindow:
    index: int
    start_sample: int
    start_s: float
    end_s: float
    token_ids: list[int]
    text: str  # as decoded, leading space included (Whisper's segments keep it)
    language: str | None
    segments: tuple[Segment, ...] = ()  # with text, in order; from timestamp tokens when the window has them


def decoded_window(tokenizer, index: int, window_samples: int, duration_s: float, token_ids: list[int],
                   language: str | None, *, avg_logprob: float | None = None,
                   no_speech_prob: float | None = None) -> DecodedWindow:
    """Window ``index`` of an input cut every ``window_samples``, with its decoded tokens."""
    window_s = window_samples / SAMPLE_RATE
    start_s = index * window_s
    end_s = min((index + 1) * window_s, duration_s)
    text = tokenizer.decode(token_ids)
    details = {"avg_logprob": avg_logprob, "no_speech_prob": no_speech_prob,
               "compression_ratio": compression_ratio(text.strip())}
    timestamp_begin = timestamp_begin_of(tokenizer)
    if timestamp_begin is not None and any(t >= timestamp_begin for t in token_ids):
        spans = window_spans(token_ids, timestamp_begin, end_s - start_s)
        segments = tuple(segment_of(tokenizer, token_ids, span, start_s, **details) for span in spans)
    else:
        segments = (Segment(start=start_s, end=end_s, text=text.strip(), token_ids=tuple(token_ids), **details),)
    return DecodedWindow(
        index=index,
        start_sample=index * window_samples,
        start_s=start_s,
        end_s=end_s,
        token_ids=list(token_ids),
        text=text,
        language=language,
        segments=tuple(s for s in segments if s.text),
    )


def timestamp_begin_of(tokenizer) -> int | None:
    """The first timestamp token of a Whisper vocabulary; None for tokenizers without timestamps."""
    special = getattr(tokenizer, "special", None)
    return getattr(special, "timestamp_begin", None)


def window_spans(token_ids: list[int], timestamp_begin: int, window_s: float) -> list[TokenSpan]:
    """A parallel window's segments: openai-whisper's split, keeping an unfinished last segment (no later window
    resumes it), and no segment past the audio."""
    split = split_window(token_ids, timestamp_begin, window_s)
    tail = unfinished_tail(token_ids, split, timestamp_begin, window_s)
    spans = list(split.spans) + ([tail] if tail else [])
    return [TokenSpan(s.start, s.stop, min(s.start_s, window_s), min(s.end_s, window_s)) for s in spans]


def segment_of(tokenizer, token_ids: list[int], span: TokenSpan, offset_s: float, *, temperature: float = 0.0,
               avg_logprob: float | None = None, compression_ratio: float | None = None,
               no_speech_prob: float | None = None) -> Segment:
    tokens = token_ids[span.start : span.stop]
    # Times to the millisecond: the window offset and 20 ms steps add up to float noise (134.92000000000002).
    return Segment(
        start=round(offset_s + span.start_s, 3),
        end=round(offset_s + span.end_s, 3),
        text=tokenizer.decode(tokens).strip(),
        token_ids=tuple(tokens),
        temperature=temperature,
        avg_logprob=avg_logprob,
        compression_ratio=compression_ratio,
        no_speech_prob=no_speech_prob,
    )


def assemble(source: str, duration_s: float, windows: list[DecodedWindow]) -> Transcription:
    """The same result ``oasr.transcribe`` gives: texts joined and stripped, the windows' segments in order."""
    return Transcription(
        source=source,
        text="".join(w.text for w in windows).strip(),
        language=windows[0].language if windows else None,
        duration_s=round(duration_s, 3),
        token_ids=[t for w in windows for t in w.token_ids],
        segments=[s for w in windows for s in w.segments],
    )
