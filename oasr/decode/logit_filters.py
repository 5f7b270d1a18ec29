"""Logit filters: batched, in-place edits of next-token logits [B, vocab] before a token is selected."""

from __future__ import annotations

from collections.abc import Sequence

import torch


class SuppressTokens:
    """Never emit these tokens (the checkpoint's ``suppress_tokens``)."""

    def __init__(self, token_ids: Sequence[int], vocab_size: int, device: torch.device) -> None:
        self.mask = torch.zeros(vocab_size, dtype=torch.bool, device=device)
        self.mask[[t for t in token_ids if 0 <= t < vocab_size]] = True

    def __call__(self, logits: torch.Tensor, step: int) -> None:
        logits.masked_fill_(self.mask, float("-inf"))


class SuppressAtBegin(SuppressTokens):
    """Forbid tokens at the first generated position only (a blank or end-of-text as first output)."""

    def __call__(self, logits: torch.Tensor, step: int) -> None:
        if step == 0:
            super().__call__(logits, step)
