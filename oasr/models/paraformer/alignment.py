"""The ``cif`` word aligner: Paraformer's word times from its CIF predictor's fire positions.

The engine frees a window's encoder output when its tokens are out, so the aligner encodes the windows again (one
batch) and runs the predictor; each row's fire and weight curves give its tokens' spans
(``oasr.models.paraformer.timestamps``), and FunASR's word rules (``oasr.tokenizers.funasr_text``) group the
tokens into words with their spans, as ``AutoModel.generate(output_timestamp=True)`` reports them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from oasr.models.aligners import WORD_ALIGNERS
from oasr.models.base import AlignmentRow, TextSpan, TimedSegment
from oasr.models.paraformer.timestamps import token_spans
from oasr.types import Word


def real_frames(features: torch.Tensor) -> torch.Tensor:
    """features: [B, T, D], zero past each row's frames (the FunASR frontend pads so) -> frames [B]."""
    if features.shape[1] == 0:  # every row under 25 ms: no frames at all
        return torch.zeros(features.shape[0], dtype=torch.long, device=features.device)
    nonzero = features.abs().amax(dim=2) > 0  # [B, T]
    positions = torch.arange(1, features.shape[1] + 1, device=features.device)
    return (nonzero * positions).amax(dim=1)


@WORD_ALIGNERS.register("cif")
class CifAligner:
    @staticmethod
    def align_words(loaded: Any, rows: Sequence[AlignmentRow], features: torch.Tensor) -> list[list[Word]]:
        """Words of each row, in seconds from the input's start, from the rows' features [B, T, D]."""
        model, tokenizer = loaded.model, loaded.tokenizer
        lengths = real_frames(features)
        with torch.inference_mode():
            encoded = model.encode(features.to(device=loaded.device, dtype=loaded.dtype), lengths.to(loaded.device))
            cif = model.predict(encoded.hidden, encoded.lengths)
        words = []
        for row, fires, alphas, length in zip(rows, cif.fires, cif.alphas, lengths.tolist(), strict=True):
            ids = [i for i in row.token_ids if i not in model.dropped_ids]
            span = min(length + 1, fires.shape[0]) if model.config.predictor.tail_threshold > 0 else length
            spans = token_spans(fires[:span].cpu(), alphas[:span].cpu(), tokenizer.tokens(ids))
            sentence = tokenizer.sentence(ids, spans)
            words.append([Word(word, row.time_offset + start / 1000, row.time_offset + end / 1000, 1.0)
                          for word, (start, end) in zip(sentence.words, sentence.spans)])
        return words

    @staticmethod
    def window_words(loaded: Any, rows: Sequence[AlignmentRow], features: torch.Tensor) -> list[list[Any]]:
        """The sequential driver needs timestamp tokens, which Paraformer has none of: never reached (the
        capability record names only the parallel driver)."""
        raise NotImplementedError("Paraformer is driven in parallel windows only")

    @staticmethod
    def place_words(words: list[Any], spans: Sequence[TextSpan], time_offset: float,
                    last_speech_end: float) -> tuple[list[TimedSegment], float]:
        raise NotImplementedError("Paraformer is driven in parallel windows only")
