"""Per-window results and their assembly into one ``Transcription`` (shared by offline runs and the server)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from oasr.audio import SAMPLE_RATE
from oasr.transcription.segments import TokenSpan, compression_ratio, split_window, unfinished_tail
from oasr.types import Segment, Transcription, Word


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
    words: tuple[Word, ...] = ()  # only when word timestamps were asked for


def decoded_window(tokenizer, index: int, window_samples: int, duration_s: float, token_ids: list[int],
                   language: str | None, *, avg_logprob: float | None = None,
                   no_speech_prob: float | None = None) -> DecodedWindow:
    """Window ``index`` of an input cut every ``window_samples``, with its decoded tokens."""
    end_sample = min((index + 1) * window_samples, round(duration_s * SAMPLE_RATE))
    return decoded_span(tokenizer, index, index * window_samples, end_sample, token_ids, language,
                        avg_logprob=avg_logprob, no_speech_prob=no_speech_prob)


def decoded_span(tokenizer, index: int, start_sample: int, end_sample: int, token_ids: list[int],
                 language: str | None, *, avg_logprob: float | None = None,
                 no_speech_prob: float | None = None) -> DecodedWindow:
    """Window ``index`` covering samples ``[start_sample, end_sample)`` of its input, with its decoded tokens
    (windows planned at silences have their own starts and lengths)."""
    start_s, end_s = start_sample / SAMPLE_RATE, end_sample / SAMPLE_RATE
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
        start_sample=start_sample,
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


def with_words(window: DecodedWindow, words: tuple[Word, ...]) -> DecodedWindow:
    """The window with its words, each handed to the segment its middle falls in (the nearest one otherwise)."""
    if not window.segments:
        return replace(window, words=words)
    by_segment: list[list[Word]] = [[] for _ in window.segments]
    for word in words:
        middle = (word.start + word.end) / 2
        best = min(range(len(window.segments)), key=lambda i: _distance(window.segments[i], middle))
        by_segment[best].append(word)
    segments = tuple(replace(s, words=tuple(ws)) for s, ws in zip(window.segments, by_segment, strict=True))
    return replace(window, words=words, segments=segments)


def _distance(segment: Segment, time_s: float) -> float:
    return max(segment.start - time_s, time_s - segment.end, 0.0)


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
