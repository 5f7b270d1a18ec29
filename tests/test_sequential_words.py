"""Where the sequential long-form cursor moves once a window has word timings (openai-whisper's
``transcribe(word_timestamps=True)``): to the last word's end when the window stopped mid-speech, past the whole
window when it ended on a lone timestamp. Decoder outputs and alignments are fabricated; parity with
openai-whisper on real audio is in ``test_openai_whisper_parity.py``."""

from __future__ import annotations

import pytest
import torch

from oasr.engine.request import RequestOutput, RequestTimings
from oasr.transcription.sequential import LongFormCursor
from oasr.models.whisper.words import WordTiming
from oasr.types import FallbackOptions, TranscribeOptions

WINDOW_FRAMES = 3000
CONTENT_FRAMES = 6000  # 60 s of audio: the first window is full


@pytest.fixture
def cursor(tiny_en) -> LongFormCursor:
    options = TranscribeOptions(long_form="sequential", word_timestamps=True,
                                fallback=FallbackOptions(temperatures=(0.0,)))
    mel = torch.zeros(80, CONTENT_FRAMES + WINDOW_FRAMES)
    return LongFormCursor("x", torch.zeros(CONTENT_FRAMES * 160).numpy(), mel, loaded=tiny_en, options=options,
                          window_frames=WINDOW_FRAMES)


def decode_window(cursor: LongFormCursor, tokens: list[int]) -> None:
    request = cursor.next_request()
    assert request is not None
    cursor.accept(RequestOutput("w", tokens, "en", True, "stop", RequestTimings(), sum_logprob=-0.1 * len(tokens),
                                no_speech_prob=0.0))


def words_of(tokenizer, timings: list[tuple[str, float, float]]) -> list[WordTiming]:
    return [WordTiming(word, tokenizer.encode(word), start, end, 0.9) for word, start, end in timings]


def timestamp(tokenizer, seconds: float) -> int:
    return tokenizer.special.timestamp_begin + round(seconds / 0.02)


def test_a_window_that_stops_mid_speech_resumes_at_its_last_word_end(cursor, tiny_en) -> None:
    tok = tiny_en.tokenizer
    hello, world, again = tok.encode(" hello"), tok.encode(" world"), tok.encode(" again")
    # "<|0.00|> hello world<|5.00|><|5.00|> again": the closed segment ends at 5.00 s, "again" is unfinished.
    decode_window(cursor, [timestamp(tok, 0.0), *hello, *world, timestamp(tok, 5.0), timestamp(tok, 5.0), *again])
    assert cursor.seek == 0 and cursor.unaligned is not None  # nothing moves before the words are known
    row = cursor.alignment_row()
    assert list(row.token_ids) == [timestamp(tok, 0.0), *hello, *world, timestamp(tok, 5.0)]  # not the tail
    cursor.place(words_of(tok, [(" hello", 0.4, 1.0), (" world", 1.0, 5.3)]))
    assert cursor.seek == 530  # the last word's end, not the last timestamp (500)
    assert cursor.last_speech_end == pytest.approx(5.3)
    [segment] = cursor.segments
    assert (segment.start, segment.end) == (0.4, 5.3)  # bounds follow the words within 0.5 s
    assert [(w.word, w.start, w.end) for w in segment.words] == [(" hello", 0.4, 1.0), (" world", 1.0, 5.3)]


def test_a_window_ending_on_a_lone_timestamp_is_consumed_whole(cursor, tiny_en) -> None:
    tok = tiny_en.tokenizer
    hello = tok.encode(" hello")
    decode_window(cursor, [timestamp(tok, 0.0), *hello, timestamp(tok, 2.0)])
    cursor.place(words_of(tok, [(" hello", 0.5, 1.5)]))
    assert cursor.seek == WINDOW_FRAMES
    assert cursor.last_speech_end == pytest.approx(1.5)
    assert [w.word for w in cursor.segments[0].words] == [" hello"]
