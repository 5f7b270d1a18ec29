"""Per-window results and their assembly into one ``Transcription`` (shared by offline runs and the server)."""

from __future__ import annotations

from dataclasses import dataclass

from oasr.audio import SAMPLE_RATE
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
    words: tuple[Word, ...] = ()  # only when word timestamps were asked for



def decoded_window(tokenizer, index: int, window_samples: int, duration_s: float, token_ids: list[int],
                   language: str | None) -> DecodedWindow:
    """Window ``index`` of an input cut every ``window_samples``, with its decoded tokens."""
    window_s = window_samples / SAMPLE_RATE
    return DecodedWindow(
        index=index,
        start_sample=index * window_samples,
        start_s=index * window_s,
        end_s=min((index + 1) * window_s, duration_s),
        token_ids=list(token_ids),
        text=tokenizer.decode(token_ids),
        language=language,
    )


def decoded_span(tokenizer, index: int, start_sample: int, end_sample: int, token_ids: list[int],
                 language: str | None) -> DecodedWindow:
    """Window ``index`` covering samples ``[start_sample, end_sample)`` of its input, with its decoded tokens."""
    return DecodedWindow(
        index=index,
        start_sample=start_sample,
        start_s=start_sample / SAMPLE_RATE,
        end_s=end_sample / SAMPLE_RATE,
        token_ids=list(token_ids),
        text=tokenizer.decode(token_ids),
        language=language,
    )


def assemble(source: str, duration_s: float, windows: list[DecodedWindow]) -> Transcription:
    """The same result ``oasr.transcribe`` gives: texts joined and stripped, one segment per non-empty window."""
    segments = [
        Segment(start=w.start_s, end=w.end_s, text=w.text.strip(), words=w.words) for w in windows if w.text.strip()
    ]
    return Transcription(
        source=source,
        text="".join(w.text for w in windows).strip(),
        language=windows[0].language if windows else None,
        duration_s=round(duration_s, 3),
        token_ids=[t for w in windows for t in w.token_ids],
        segments=segments,
    )
