"""``paired_wer_difference``: the corpus WER gap between two systems on the same utterances, and a paired
bootstrap interval saying how much of it the choice of utterances could explain."""

from __future__ import annotations

import pytest

from oasr.bench.wer import paired_wer_difference, word_error_rate

REFERENCES = ["the cat sat on the mat", "hello world", "one two three four five six", "we went home early today"]


def test_the_difference_is_the_corpus_wer_gap() -> None:
    base = ["the cat sat on the mat", "hello word", "one two three four five six", "we went home early"]
    other = ["the cat sat on a mat", "hello world", "one two tree four five", "we went home early today"]
    result = paired_wer_difference(REFERENCES, base, other)
    want = word_error_rate(REFERENCES, other).wer - word_error_rate(REFERENCES, base).wer
    assert result.difference == pytest.approx(want)
    assert result.low <= result.difference <= result.high
    assert result.low < 0 < result.high  # errors moved between utterances: four of them cannot tell the two apart


def test_identical_systems_differ_by_nothing_in_every_draw() -> None:
    result = paired_wer_difference(REFERENCES, REFERENCES, REFERENCES, resamples=50)
    assert (result.difference, result.low, result.high) == (0.0, 0.0, 0.0)


def test_a_system_worse_on_every_utterance_has_an_interval_above_zero() -> None:
    worse = [r.rsplit(" ", 1)[0] for r in REFERENCES]  # the last word dropped everywhere
    result = paired_wer_difference(REFERENCES, REFERENCES, worse, seed=3)
    assert 0 < result.low <= result.difference <= result.high
    assert result.difference == pytest.approx(word_error_rate(REFERENCES, worse).wer)  # the base is perfect


def test_the_draws_are_seeded_and_the_arguments_checked() -> None:
    # Forty utterances with different error counts: unseeded draws would give other quantiles.
    many = [" ".join(["word"] * (3 + i % 7)) for i in range(40)]
    cut = [" ".join(r.split()[: -(i % 3)] or ["x"]) if i % 3 else r for i, r in enumerate(many)]
    runs = [paired_wer_difference(many, many, cut, resamples=200, seed=seed) for seed in (7, 7, 8)]
    assert runs[0] == runs[1] and runs[0] != runs[2]
    other = ["the cat sat", "hello world", "one two three four five six", "we went home"]
    with pytest.raises(ValueError, match="4 references, 4 and 3 hypotheses"):
        paired_wer_difference(REFERENCES, REFERENCES, other[:3])
    with pytest.raises(ValueError, match="confidence in"):
        paired_wer_difference(REFERENCES, REFERENCES, other, confidence=1.0)
