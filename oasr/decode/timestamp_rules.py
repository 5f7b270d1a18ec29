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

from oasr.decode.timestamp_grid import CHUNK_SECONDS, NUM_AUDIO_POSITIONS, SECONDS_PER_TIMESTAMP  # noqa: F401
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
        self.vocab_size = vocab_size
        self.vocab = torch.arange(vocab_size, device=device)
        tb = tokens.timestamp_begin
        self.is_timestamp = self.vocab >= tb
        # The first token is a timestamp within the first second.
        self.first_forbidden = (self.vocab < tb) | (self.vocab > tb + tokens.max_initial_index)

    def apply(self, logits: torch.Tensor, state: TimestampState, *, first: bool) -> torch.Tensor:
        """logits: [B, vocab] float -> filtered logits [B, vocab] (a new tensor). ``first``: every row is choosing
        its first token (the step after the prompt).

        Every rule forbids a prefix of the text tokens and a prefix of the timestamps, so a row's forbidden set
        is two bounds: ``vocab < text_end`` or ``timestamp_begin <= vocab < timestamp_floor``."""
        tb = self.tokens.timestamp_begin
        on = state.enabled
        if first:
            forbidden = on[:, None] & self.first_forbidden
        else:
            last_ts = state.last >= tb
            previous_ts = state.previous >= tb
            after_text = last_ts & ~previous_ts  # an end timestamp just followed text: another timestamp (or the end)
            after_pair = last_ts & previous_ts  # a segment just closed: text (or the end)
            text_end = torch.where(on & after_text, self.tokens.eot, 0)
            # Timestamps never decrease, and after text the next one is strictly later (no empty segments).
            floor = torch.where(after_text, state.last_timestamp, state.last_timestamp + 1)
            floor = torch.where(state.last_timestamp >= tb, floor, tb)
            floor = torch.where(after_pair, self.vocab_size, floor)
            floor = torch.where(on, floor, tb)
            vocab = self.vocab
            forbidden = (vocab < text_end[:, None]) | (self.is_timestamp & (vocab < floor[:, None]))
        logits = logits.masked_fill(forbidden, float("-inf"))
        nt = self.tokens.no_timestamps
        logits[:, nt] = torch.where(on, float("-inf"), logits[:, nt])
        # When the timestamps together are likelier than any single other token, a timestamp comes next.
        # (Compared on logits: both sides of openai-whisper's log-softmax comparison share the normaliser.)
        timestamp_mass = logits[:, tb:].logsumexp(dim=-1)
        best_other = logits[:, :tb].amax(dim=-1)
        force = on & (timestamp_mass > best_other)
        logits[:, :tb] = logits[:, :tb].masked_fill(force[:, None], float("-inf"))
        return logits
