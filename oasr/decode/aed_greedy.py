"""Token selection for attention encoder-decoders: logit filters, then argmax or sampling, on whole batches.

The engine owns the loop (and its KV cache); this strategy decides one token per row per step without host
syncs, so it can run inside a captured CUDA graph. Filters, in openai-whisper's order: suppress (blank and
end-of-text at the first step, the checkpoint's suppress list always), the minimum-length bound on end-of-text,
then the timestamp rules for rows decoding with timestamps. Each row is greedy (temperature 0) or samples from
``softmax(logits / temperature)``; the log-probability reported for the chosen token is that of the filtered
logits at temperature 1, as openai-whisper scores its fallback.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch

from oasr.decode import DECODE_STRATEGIES
from oasr.decode.base import DecodeStrategy
from oasr.decode.timestamp_rules import TimestampRules, TimestampState, TimestampTokens


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
    timestamp_tokens: TimestampTokens | None = None  # the vocabulary's timestamp tokens, if it has them
    # Tokens besides ``eot`` that also end generation (transformers' list of eos ids); like ``eot``, they are held
    # back below a row's minimum length and are not part of the output.
    stop_tokens: tuple[int, ...] = ()


@dataclass(frozen=True)
class AEDRowState:
    """Per-row inputs besides the logits, each [B] (views of the engine's slot buffers)."""

    eot_allowed: torch.Tensor  # bool: False while a row is below its minimum length
    temperature: torch.Tensor  # float32: 0 = greedy
    timestamps: TimestampState | None = None  # None: no row decodes with timestamps


@DECODE_STRATEGIES.register("aed_greedy")
class AEDGreedy(DecodeStrategy):
    runner: ClassVar[str] = "autoregressive"  # the runner kind that drives it
    searches: ClassVar[bool] = False  # serves DecodeOptions.beam_size

    def __init__(self, options: AEDGreedyOptions, device: torch.device) -> None:
        self.options = options
        self.suppress = token_mask(options.suppress_tokens, options.vocab_size, device)
        self.begin_suppress = token_mask(options.begin_suppress_tokens, options.vocab_size, device) | self.suppress
        ts = options.timestamp_tokens
        self.timestamp_rules = TimestampRules(ts, options.vocab_size, device) if ts is not None else None

    def select(
        self, logits: torch.Tensor, rows: AEDRowState, *, first: bool, sampling: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """logits: [B, vocab] float -> (next tokens [B] int64, their log-probabilities [B] float32).
        ``first``: every row chooses its first generated token. ``sampling``: some row may have a temperature
        above 0 (when False, every row is greedy and no random numbers are drawn)."""
        return self.choose(self.filter(logits, rows, first=first), rows, sampling=sampling)

    def filter(self, logits: torch.Tensor, rows: AEDRowState, *, first: bool) -> torch.Tensor:
        """The logit filters: logits [B, vocab] -> filtered float32 logits [B, vocab] (a new tensor; forbidden
        tokens at -inf). Beam search ranks its continuations on these too, as openai-whisper does."""
        logits = logits.masked_fill(self.begin_suppress if first else self.suppress, float("-inf"))
        eot = self.options.eot
        logits[:, eot] = torch.where(rows.eot_allowed, logits[:, eot], float("-inf"))
        for stop in self.options.stop_tokens:
            logits[:, stop] = torch.where(rows.eot_allowed, logits[:, stop], float("-inf"))
        if rows.timestamps is not None:
            if self.timestamp_rules is None:
                raise ValueError("this vocabulary has no timestamp tokens")
            logits = self.timestamp_rules.apply(logits, rows.timestamps, first=first)
        return logits.float()

    @staticmethod
    def choose(logits: torch.Tensor, rows: AEDRowState, *, sampling: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Filtered logits [B, vocab] -> (each row's argmax or draw [B] int64, its log-probability [B] float32)."""
        tokens = logits.argmax(dim=-1)
        if sampling:
            tokens = torch.where(rows.temperature > 0, sample(logits, rows.temperature), tokens)
        logprobs = logits.gather(1, tokens[:, None])[:, 0] - logits.logsumexp(dim=-1)
        return tokens, logprobs


def sample(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """One draw per row from softmax(logits / temperature) without a host sync: the argmax of the probabilities
    divided by exponential noise picks index i with probability p_i. logits: [B, V]; temperature: [B] (rows at 0
    get an arbitrary draw the caller discards) -> [B] int64."""
    scale = torch.where(temperature > 0, temperature, torch.ones_like(temperature))
    probs = torch.softmax(logits / scale[:, None], dim=-1)
    noise = torch.empty_like(probs).exponential_(1)
    return (probs / noise).argmax(dim=-1)
