"""Whisper's timestamp-token rules as a batched logit filter (openai-whisper's ``ApplyTimestampRules``).

Timestamp tokens follow ``<|notimestamps|>``, one per 20 ms of the window. A row decoding with timestamps
writes ``<|t0|> text <|t1|> <|t1|> text <|t2|> ...``: timestamps come in pairs (except right before the end),
never decrease, and a segment has non-zero length. Where openai-whisper loops over the rows and reads each one's
history on the host, this filter reads a few per-row tensors the caller keeps up to date (``TimestampState``),
so it runs inside a captured CUDA graph without host syncs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

CHUNK_SECONDS = 30.0
NUM_AUDIO_POSITIONS = 1500  # encoder positions per window
SECONDS_PER_TIMESTAMP = CHUNK_SECONDS / NUM_AUDIO_POSITIONS  # 0.02 s
MAX_INITIAL_TIMESTAMP_S = 1.0  # a window's first segment starts within its first second


@dataclass(frozen=True)
class TimestampTokens:
    eot: int
    no_timestamps: int
    timestamp_begin: int  # <|0.00|>
    max_initial_index: int = round(MAX_INITIAL_TIMESTAMP_S / SECONDS_PER_TIMESTAMP)


@dataclass(frozen=True)
class TimestampState:
    """Per-row inputs of the rules, each [B]; rows with ``enabled`` False are left untouched.

    last: the newest sampled token; previous: the one before it, or any timestamp id while fewer than two tokens
    were sampled (the rule then treats it as a timestamp, as openai-whisper does); last_timestamp: the newest
    sampled timestamp token, or any id below ``timestamp_begin`` when none was sampled yet."""

    enabled: torch.Tensor  # bool
    last: torch.Tensor  # int64
    previous: torch.Tensor  # int64
    last_timestamp: torch.Tensor  # int64


class TimestampRules:
    def __init__(self, tokens: TimestampTokens, vocab_size: int, device: torch.device) -> None:
        self.tokens = tokens
        vocab = torch.arange(vocab_size, device=device)
        self.vocab = vocab
        self.is_timestamp = vocab >= tokens.timestamp_begin
        self.is_text = vocab < tokens.eot
        self.before_timestamps = ~self.is_timestamp  # text, end-of-text and the other special tokens
        self.first_forbidden = self.before_timestamps | (vocab > tokens.timestamp_begin + tokens.max_initial_index)
        self.no_timestamps = vocab == tokens.no_timestamps

    def apply(self, logits: torch.Tensor, state: TimestampState, *, first: bool) -> torch.Tensor:
        """logits: [B, vocab] float -> filtered logits [B, vocab] (a new tensor). ``first``: every row is choosing
        its first token (the step after the prompt)."""
        on = state.enabled[:, None]
        if first:
            # The first token is a timestamp within the first second.
            forbidden = on & (self.first_forbidden | self.no_timestamps)
        else:
            tb = self.tokens.timestamp_begin
            last_ts = state.last >= tb
            previous_ts = state.previous >= tb
            after_pair = (last_ts & previous_ts)[:, None]  # a segment just closed: text (or the end) follows
            after_text = (last_ts & ~previous_ts)[:, None]  # an end timestamp follows text: another timestamp
            # Timestamps never decrease, and after text the next one is strictly later (non-empty segments).
            floor = torch.where(last_ts & ~previous_ts, state.last_timestamp, state.last_timestamp + 1)
            seen = (state.last_timestamp >= tb)[:, None]
            forbidden = self.no_timestamps | (after_pair & self.is_timestamp) | (after_text & self.is_text)
            forbidden = on & (forbidden | (seen & self.is_timestamp & (self.vocab < floor[:, None])))
        logits = logits.masked_fill(forbidden, float("-inf"))
        # When the timestamps together are likelier than any single other token, a timestamp comes next.
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        tb = self.tokens.timestamp_begin
        timestamp_mass = logprobs[:, tb:].logsumexp(dim=-1)
        best_other = logprobs[:, :tb].amax(dim=-1)
        force = state.enabled & (timestamp_mass > best_other)
        return logits.masked_fill(force[:, None] & self.before_timestamps, float("-inf"))
