"""Word error rate with Whisper's text normalizers (``whisper-normalizer``) and ``jiwer``.

English uses Whisper's English normalizer (spelling, numbers, fillers); other languages its basic one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from oasr.errors import OASRError


@dataclass(frozen=True)
class WERReport:
    wer: float
    num_utterances: int
    num_reference_words: int
    substitutions: int
    deletions: int
    insertions: int


def normalizer(language: str | None):
    try:
        from whisper_normalizer.basic import BasicTextNormalizer
        from whisper_normalizer.english import EnglishTextNormalizer
    except ImportError as exc:  # pragma: no cover - exercised only without the eval extra
        raise OASRError("WER needs the eval extra: pip install 'oasr[eval]'") from exc
    return EnglishTextNormalizer() if language in (None, "en") else BasicTextNormalizer()


def _normalized(language: str | None, references: Sequence[str], *hypotheses: Sequence[str]) -> list[tuple[str, ...]]:
    """(reference, hypotheses...) per utterance, normalized; utterances whose reference normalizes to nothing are
    left out."""
    norm = normalizer(language)
    rows = [tuple(norm(t) for t in row) for row in zip(references, *hypotheses, strict=True)]
    rows = [row for row in rows if row[0].strip()]
    if not rows:
        raise ValueError("no reference has any words after normalization")
    return rows


def word_error_rate(references: Sequence[str], hypotheses: Sequence[str], language: str | None = "en") -> WERReport:
    """Corpus WER over normalized texts; utterances whose reference normalizes to nothing are skipped."""
    import jiwer

    if len(references) != len(hypotheses):
        raise ValueError(f"{len(references)} references but {len(hypotheses)} hypotheses")
    pairs = _normalized(language, references, hypotheses)
    out = jiwer.process_words([r for r, _ in pairs], [h for _, h in pairs])
    num_words = out.hits + out.substitutions + out.deletions
    return WERReport(
        wer=out.wer,
        num_utterances=len(pairs),
        num_reference_words=num_words,
        substitutions=out.substitutions,
        deletions=out.deletions,
        insertions=out.insertions,
    )


@dataclass(frozen=True)
class WERDifference:
    """Corpus WER of ``other`` minus that of ``base`` over the same utterances, with a paired bootstrap interval."""

    difference: float
    low: float  # the interval's ends: the resampled differences' (1 - confidence) / 2 quantile and its mirror
    high: float
    confidence: float
    resamples: int


def paired_wer_difference(references: Sequence[str], base: Sequence[str], other: Sequence[str],
                          language: str | None = "en", *, resamples: int = 2000, confidence: float = 0.95,
                          seed: int = 0) -> WERDifference:
    """How far apart two systems' corpus WERs are on these utterances, and how much of that the choice of
    utterances could explain: both systems' errors are counted per utterance (normalized as
    ``word_error_rate`` does), then utterances are drawn with replacement ``resamples`` times and the corpus WER
    difference of each draw computed. A difference whose interval straddles a bound cannot be said to be within
    or beyond it on this set."""
    import jiwer
    import numpy as np

    if not len(references) == len(base) == len(other):
        raise ValueError(f"{len(references)} references, {len(base)} and {len(other)} hypotheses")
    if resamples < 1 or not 0 < confidence < 1:
        raise ValueError(f"resamples must be at least 1 and confidence in (0, 1), got {resamples}, {confidence}")
    rows = _normalized(language, references, base, other)

    def errors(reference: str, hypothesis: str) -> int:
        out = jiwer.process_words(reference, hypothesis)
        return out.substitutions + out.deletions + out.insertions

    words = np.array([len(r.split()) for r, _, _ in rows], dtype=np.float64)
    gap = np.array([errors(r, b) - errors(r, a) for r, a, b in rows], dtype=np.float64)
    draws = np.random.default_rng(seed).integers(0, len(rows), size=(resamples, len(rows)))
    resampled = gap[draws].sum(axis=1) / words[draws].sum(axis=1)
    tail = (1 - confidence) / 2
    return WERDifference(float(gap.sum() / words.sum()), float(np.quantile(resampled, tail)),
                         float(np.quantile(resampled, 1 - tail)), confidence, resamples)
