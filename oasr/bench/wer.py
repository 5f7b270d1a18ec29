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


def word_error_rate(references: Sequence[str], hypotheses: Sequence[str], language: str | None = "en") -> WERReport:
    """Corpus WER over normalized texts; utterances whose reference normalizes to nothing are skipped."""
    import jiwer

    if len(references) != len(hypotheses):
        raise ValueError(f"{len(references)} references but {len(hypotheses)} hypotheses")
    norm = normalizer(language)
    pairs = [(norm(r), norm(h)) for r, h in zip(references, hypotheses, strict=True)]
    pairs = [(r, h) for r, h in pairs if r.strip()]
    if not pairs:
        raise ValueError("no reference has any words after normalization")
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
