"""A window's timestamped tokens -> segments, and how far the window moves the long-form cursor.

Tokens decoded with timestamps read ``<|t0|> text <|t1|><|t1|> text <|t2|> ...`` (see
``oasr.decode.timestamp_rules``). Two timestamps in a row close one segment and open the next. A window that
ends in a lone timestamp after text has nothing after it; a window that ends mid-segment (the decoder stopped
inside a sentence that runs past the window) is resumed from its last closed timestamp, as openai-whisper does.
Pure host logic, no tensors.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from oasr.decode.timestamp_grid import SECONDS_PER_TIMESTAMP

HOP_SAMPLES = 160  # feature frames are 10 ms
FRAMES_PER_TIMESTAMP = 2  # 3000 frames per window / 1500 timestamp positions
FRAMES_PER_SECOND = 16_000 // HOP_SAMPLES


@dataclass(frozen=True)
class TokenSpan:
    """tokens[start:stop] of a window form one segment from ``start_s`` to ``end_s`` (seconds into the window)."""

    start: int
    stop: int
    start_s: float
    end_s: float


@dataclass(frozen=True)
class WindowSplit:
    spans: tuple[TokenSpan, ...]
    # Feature frames the window consumed: up to its last closed timestamp, or the whole window (None) when it
    # ends cleanly or holds no closed pair.
    consumed_frames: int | None


def split_window(tokens: list[int], timestamp_begin: int, window_s: float) -> WindowSplit:
    """openai-whisper's segment rules for one window's tokens (``window_s``: the audio the window holds)."""
    is_ts = [t >= timestamp_begin for t in tokens]
    single_ending = ends_on_single_timestamp(tokens, timestamp_begin)
    cuts = [i + 1 for i in range(len(tokens) - 1) if is_ts[i] and is_ts[i + 1]]
    if not cuts:
        timestamps = [t for t, ts in zip(tokens, is_ts, strict=True) if ts]
        end_s = window_s
        if timestamps and timestamps[-1] != timestamp_begin:
            end_s = (timestamps[-1] - timestamp_begin) * SECONDS_PER_TIMESTAMP
        return WindowSplit((TokenSpan(0, len(tokens), 0.0, end_s),), None)
    if single_ending:
        cuts.append(len(tokens))
    spans, start = [], 0
    for stop in cuts:
        spans.append(TokenSpan(
            start, stop,
            (tokens[start] - timestamp_begin) * SECONDS_PER_TIMESTAMP,
            (tokens[stop - 1] - timestamp_begin) * SECONDS_PER_TIMESTAMP,
        ))
        start = stop
    if single_ending:
        return WindowSplit(tuple(spans), None)
    return WindowSplit(tuple(spans), (tokens[start - 1] - timestamp_begin) * FRAMES_PER_TIMESTAMP)


def ends_on_single_timestamp(tokens: list[int], timestamp_begin: int) -> bool:
    """Text then one timestamp: nothing is said after it, so the whole window is consumed."""
    return [t >= timestamp_begin for t in tokens[-2:]] == [False, True]


def unfinished_tail(tokens: list[int], split: WindowSplit, timestamp_begin: int, window_s: float) -> TokenSpan | None:
    """The tokens after the last closed segment (when the window stopped mid-segment), as a segment running to the
    window's end: what parallel windows keep, having no next window that starts from the last timestamp."""
    if split.consumed_frames is None:
        return None
    start = split.spans[-1].stop
    if start >= len(tokens):
        return None
    opening = tokens[start]  # the second timestamp of the last pair opens the tail
    start_s = split.spans[-1].end_s
    if opening >= timestamp_begin:
        start_s = (opening - timestamp_begin) * SECONDS_PER_TIMESTAMP
    return TokenSpan(start, len(tokens), start_s, window_s)


def compression_ratio(text: str) -> float:
    """How well the text compresses (zlib); repetition loops score high. openai-whisper's measure."""
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data))
