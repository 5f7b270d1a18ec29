"""Greedy token selection for attention encoder-decoders: logit filters, then argmax, on whole batches.

The engine owns the loop (and its KV cache); this strategy decides one token per row per step without host
syncs, so it can run inside a captured CUDA graph.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch

from oasr.decode import DECODE_STRATEGIES


def token_mask(token_ids: Sequence[int], vocab_size: int, device: torch.device) -> torch.Tensor:
    mask = torch.zeros(vocab_size, dtype=torch.bool, device=device)
    mask[[t for t in token_ids if 0 <= t < vocab_size]] = True
    return mask


@dataclass(frozen=True)
class AEDGreedyOptions:
    eot: int
    vocab_size: int
    suppress_tokens: tuple[int, ...] = ()  # never emitted
    begin_suppress_tokens: tuple[int, ...] = ()  # not emitted as the first generated token


@DECODE_STRATEGIES.register("aed_greedy")
class AEDGreedy:
    consumes: ClassVar[str] = "encoder_hidden_states"
    incremental: ClassVar[bool] = True

    def __init__(self, options: AEDGreedyOptions, device: torch.device) -> None:
        self.options = options
        self.suppress = token_mask(options.suppress_tokens, options.vocab_size, device)
        self.begin_suppress = token_mask(options.begin_suppress_tokens, options.vocab_size, device) | self.suppress

    def select(self, logits: torch.Tensor, *, first: bool, eot_allowed: torch.Tensor) -> torch.Tensor:
        """logits: [B, vocab] float; eot_allowed: bool [B] (False while a row is below its minimum length)
        -> next tokens [B] (int64)."""
        logits = logits.masked_fill(self.begin_suppress if first else self.suppress, float("-inf"))
        eot = self.options.eot
        logits[:, eot] = torch.where(eot_allowed, logits[:, eot], float("-inf"))
        return logits.argmax(dim=-1)
