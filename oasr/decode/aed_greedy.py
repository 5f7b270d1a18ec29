"""Batched greedy decoding for attention encoder-decoders, against a preallocated KV cache."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch

from oasr.decode import DECODE_STRATEGIES
from oasr.decode.logit_filters import SuppressAtBegin, SuppressTokens

LogitFilter = Callable[[torch.Tensor, int], None]


class AEDModel(Protocol):
    def new_cache(self, encoder_out: torch.Tensor, max_positions: int | None = None) -> object: ...

    def decode(self, tokens: torch.Tensor, cache: object, offset: int) -> torch.Tensor: ...


@dataclass(frozen=True)
class AEDGreedyOptions:
    eot: int
    vocab_size: int
    max_length: int  # prompt + generated tokens, as Whisper's 448-position decoder allows
    suppress_tokens: tuple[int, ...] = ()
    begin_suppress_tokens: tuple[int, ...] = ()


@DECODE_STRATEGIES.register("aed_greedy")
class AEDGreedyDecoder:
    consumes: ClassVar[str] = "encoder_hidden_states"
    incremental: ClassVar[bool] = True

    def __init__(self, options: AEDGreedyOptions, device: torch.device) -> None:
        self.options = options
        self.filters: list[LogitFilter] = [
            SuppressTokens(options.suppress_tokens, options.vocab_size, device),
            SuppressAtBegin(options.begin_suppress_tokens, options.vocab_size, device),
        ]

    def decode(self, model: AEDModel, encoder_out: torch.Tensor, prompts: torch.Tensor) -> list[list[int]]:
        """encoder_out: [B, S, D]; prompts: [B, P] (one prompt length per batch) -> generated ids per row,
        without the prompt and without the end-of-text token."""
        o = self.options
        batch, prompt_len = prompts.shape
        budget = o.max_length - prompt_len
        if budget <= 0:
            raise ValueError(f"prompt of {prompt_len} tokens leaves no room under max_length {o.max_length}")
        cache = model.new_cache(encoder_out, max_positions=o.max_length)
        logits = model.decode(prompts, cache, 0)[:, -1]
        out = torch.full((batch, budget), o.eot, dtype=torch.long, device=prompts.device)
        finished = torch.zeros(batch, dtype=torch.bool, device=prompts.device)
        num_steps = 0
        for step in range(budget):
            for apply in self.filters:
                apply(logits, step)
            tokens = torch.where(finished, o.eot, logits.argmax(dim=-1))
            out[:, step] = tokens
            finished |= tokens == o.eot
            num_steps = step + 1
            if step + 1 == budget or bool(finished.all()):
                break
            logits = model.decode(tokens[:, None], cache, prompt_len + step)[:, -1]
        return [_until_eot(row, o.eot) for row in out[:, :num_steps].tolist()]


def _until_eot(row: Sequence[int], eot: int) -> list[int]:
    row = list(row)
    return row[: row.index(eot)] if eot in row else row
