"""CPU unit tests of the decoding pieces timestamps and long-form need: the batched timestamp rules against
openai-whisper's ``ApplyTimestampRules``, sampling without host syncs, the segment split and seek rules, and the
fallback decisions."""

from __future__ import annotations

import random

import pytest
import torch

from oasr.decode.aed_greedy import sample
from oasr.decode.timestamp_rules import TimestampRules, TimestampState, TimestampTokens
from oasr.transcription.segments import compression_ratio, split_window, unfinished_tail
from oasr.transcription.sequential import is_silence, needs_fallback
from oasr.types import FallbackOptions

# tiny.en's vocabulary: 51864 ids, <|endoftext|> 50256, <|notimestamps|> 50362, timestamps from 50363.
VOCAB = 51864
EOT = 50256
TB = 50363
TOKENS = TimestampTokens(eot=EOT, no_timestamps=TB - 1, timestamp_begin=TB)
PROMPT = [50257]  # <|startoftranscript|>: openai's filter reads the prompt to know where sampling began


def random_history(rng: random.Random, length: int) -> list[int]:
    """Sampled tokens: text, timestamps (in any order: the rules must hold whatever came before) and pairs."""
    out = []
    for _ in range(length):
        kind = rng.random()
        if kind < 0.45:
            out.append(rng.randrange(0, EOT))
        elif kind < 0.7 and out and out[-1] >= TB:
            out.append(out[-1])  # a closed pair
        else:
            out.append(TB + rng.randrange(0, 1501))
    return out


def random_logits(rng: random.Random, batch: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(rng.randrange(1 << 30))
    logits = torch.randn(batch, VOCAB, generator=g) * 3
    # Some rows lean on timestamps, so that the "timestamp mass beats any text token" rule fires on some rows only.
    logits[::3, TB:] += 4.0
    return logits


def openai_filtered(logits: torch.Tensor, histories: list[list[int]]) -> torch.Tensor:
    from whisper.decoding import ApplyTimestampRules
    from whisper.tokenizer import get_tokenizer

    tokenizer = get_tokenizer(False, num_languages=99)
    assert (tokenizer.timestamp_begin, tokenizer.eot, tokenizer.no_timestamps) == (TB, EOT, TB - 1)
    rules = ApplyTimestampRules(tokenizer, sample_begin=len(PROMPT), max_initial_timestamp_index=50)
    out = logits.clone()
    tokens = torch.tensor([PROMPT + h for h in histories])
    rules.apply(out, tokens)
    return out


def state_of(histories: list[list[int]], enabled: list[bool]) -> TimestampState:
    """The per-row state the engine keeps, derived here from full histories."""
    last = [h[-1] if h else 0 for h in histories]
    previous = [h[-2] if len(h) >= 2 else TB for h in histories]  # fewer than two sampled: counts as a timestamp
    last_ts = [next((t for t in reversed(h) if t >= TB), 0) for h in histories]
    return TimestampState(torch.tensor(enabled), torch.tensor(last), torch.tensor(previous), torch.tensor(last_ts))


@pytest.mark.parametrize("length", [0, 1, 2, 3, 6])
def test_timestamp_rules_equal_openai_whisper_apply_timestamp_rules(length: int) -> None:
    rng = random.Random(length)
    batch = 48
    histories = [random_history(rng, length) for _ in range(batch)]
    logits = random_logits(rng, batch)
    expected = openai_filtered(logits, histories)
    ours = TimestampRules(TOKENS, VOCAB, torch.device("cpu")).apply(
        logits, state_of(histories, [True] * batch), first=length == 0
    )
    assert torch.equal(torch.isinf(ours), torch.isinf(expected))
    assert torch.equal(ours, expected)
    no_text = torch.isinf(ours[:, :EOT]).all(dim=1)
    if length == 0:  # the first token is a timestamp within the first second
        assert no_text.all() and torch.isinf(ours[:, TB + 51 :]).all() and not torch.isinf(ours[:, TB : TB + 51]).all()
    else:  # the rules bite on some rows only: some lose all text, some all timestamps
        assert no_text.any() and not no_text.all()
        no_timestamps = torch.isinf(ours[:, TB:]).all(dim=1)
        assert no_timestamps.any() and not no_timestamps.all()


def test_rows_without_timestamps_are_left_untouched() -> None:
    rng = random.Random(7)
    histories = [random_history(rng, 4) for _ in range(6)]
    logits = random_logits(rng, 6)
    enabled = [True, False, True, False, True, False]
    ours = TimestampRules(TOKENS, VOCAB, torch.device("cpu")).apply(logits, state_of(histories, enabled), first=False)
    expected = openai_filtered(logits, histories)
    for row, on in enumerate(enabled):
        assert torch.equal(ours[row], expected[row] if on else logits[row])


def test_sampling_draws_from_the_softmax_at_each_rows_temperature() -> None:
    torch.manual_seed(0)
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2, 0.0]]).clamp(min=1e-30)).repeat(3, 1)
    temperature = torch.tensor([1.0, 0.0, 0.5])
    draws = torch.stack([sample(logits, temperature) for _ in range(4000)])
    frequencies = torch.stack([(draws[:, 0] == k).float().mean() for k in range(4)])
    assert torch.allclose(frequencies, torch.tensor([0.5, 0.3, 0.2, 0.0]), atol=0.03)
    sharpened = torch.tensor([0.5, 0.3, 0.2]) ** 2
    sharpened /= sharpened.sum()
    assert (draws[:, 2] == 0).float().mean().item() == pytest.approx(sharpened[0].item(), abs=0.03)
    assert (draws[:, 2] == 3).sum() == 0  # a zero-probability token is never drawn


def ts(seconds: float) -> int:
    return TB + round(seconds / 0.02)


def test_split_closed_segments_resume_from_the_last_closed_timestamp() -> None:
    tokens = [ts(0), 11, 12, ts(2.0), ts(2.0), 13, ts(4.5), ts(4.6), 14]  # decoding stopped inside a sentence
    split = split_window(tokens, TB, 30.0)
    assert [(s.start, s.stop, s.start_s, s.end_s) for s in split.spans] == [
        (0, 4, 0.0, 2.0), (4, 7, 2.0, 4.5)
    ]
    assert split.consumed_frames == 450  # seek to 4.50 s: the unfinished segment is decoded again
    tail = unfinished_tail(tokens, split, TB, 30.0)
    assert (tail.start, tail.stop, tail.start_s, tail.end_s) == (7, 9, pytest.approx(4.6), 30.0)


def test_split_single_timestamp_ending_consumes_the_whole_window() -> None:
    tokens = [ts(0), 11, ts(1.5), ts(1.5), 12, ts(3.0)]
    split = split_window(tokens, TB, 12.0)
    assert [(s.start, s.stop) for s in split.spans] == [(0, 3), (3, 6)]
    assert split.spans[-1].end_s == pytest.approx(3.0)
    assert split.consumed_frames is None
    assert unfinished_tail(tokens, split, TB, 12.0) is None


def test_split_without_a_closed_pair_is_one_segment() -> None:
    assert split_window([ts(0), 11, 12, ts(7.0)], TB, 20.0).spans[0].end_s == pytest.approx(7.0)
    only_text = split_window([11, 12], TB, 20.0)
    assert [(s.start, s.stop, s.start_s, s.end_s) for s in only_text.spans] == [(0, 2, 0.0, 20.0)]
    assert only_text.consumed_frames is None
    # A lone <|0.00|> says nothing about the end: the segment runs to the end of the window.
    assert split_window([ts(0), 11], TB, 20.0).spans[0].end_s == 20.0


def test_fallback_and_silence_decisions_follow_openai_whisper() -> None:
    f = FallbackOptions()
    assert needs_fallback(f, ratio=2.5, avg_logprob=-0.2, no_speech_prob=0.0)  # repetitive
    assert needs_fallback(f, ratio=1.2, avg_logprob=-1.5, no_speech_prob=0.1)  # improbable
    assert not needs_fallback(f, ratio=1.2, avg_logprob=-0.5, no_speech_prob=0.9)
    assert not needs_fallback(f, ratio=2.5, avg_logprob=-1.5, no_speech_prob=0.9)  # silence, whatever the text
    assert is_silence(f, avg_logprob=-1.5, no_speech_prob=0.9)
    assert not is_silence(f, avg_logprob=-0.5, no_speech_prob=0.9)  # confident text overrules <|nospeech|>
    assert not is_silence(f, avg_logprob=-1.5, no_speech_prob=0.3)
    off = FallbackOptions(compression_ratio_threshold=None, logprob_threshold=None, no_speech_threshold=None)
    assert not needs_fallback(off, ratio=9.0, avg_logprob=-9.0, no_speech_prob=1.0)
    assert not is_silence(off, avg_logprob=-9.0, no_speech_prob=1.0)
    assert compression_ratio("la " * 40) > 2.4 > compression_ratio("And so my fellow Americans, ask not.")
