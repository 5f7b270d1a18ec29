"""Per-slot decode state of the autoregressive runner, on the device.

Every buffer is indexed by slot, so a decode step over slots ``[0, bucket)`` reads and writes only device memory
and can be captured in a CUDA graph: the last token, the position it is written at, the block table, the
minimum-length bound, the sampling temperature, and, for models whose logit filters include openai-whisper's
timestamp rules, the rules' view of each row's history (``TimestampState``).
"""

from __future__ import annotations

import torch

from oasr.decode.aed_greedy import AEDRowState
from oasr.decode.timestamp_rules import TimestampState, TimestampTokens


class SlotState:
    def __init__(self, num_slots: int, max_blocks: int, max_positions: int, timestamps: TimestampTokens | None,
                 device: torch.device) -> None:
        long = dict(dtype=torch.long, device=device)
        self.max_positions = max_positions
        self.timestamp_tokens = timestamps
        self.tokens = torch.zeros(num_slots, **long)
        self.positions = torch.zeros(num_slots, **long)
        self.eot_from = torch.zeros(num_slots, **long)
        self.block_table = torch.zeros(num_slots, max_blocks, **long)
        self.temperature = torch.zeros(num_slots, dtype=torch.float32, device=device)
        # The timestamp rules' state (see ``TimestampState``); allocated only for vocabularies with timestamps.
        self.previous = torch.zeros(num_slots, **long)
        self.last_timestamp = torch.zeros(num_slots, **long)
        self.timestamps = torch.zeros(num_slots, dtype=torch.bool, device=device)

    def captured(self) -> tuple[torch.Tensor, ...]:
        """The buffers a decode step advances (a graph capture saves and restores them)."""
        return self.tokens, self.positions, self.previous, self.last_timestamp

    def rows(self, batch: int, *, timestamps: bool) -> AEDRowState:
        """Rows [0, batch) as the strategy reads them."""
        return AEDRowState(
            eot_allowed=self.positions[:batch] >= self.eot_from[:batch],
            temperature=self.temperature[:batch],
            timestamps=TimestampState(
                enabled=self.timestamps[:batch],
                last=self.tokens[:batch],
                previous=self.previous[:batch],
                last_timestamp=self.last_timestamp[:batch],
            ) if timestamps else None,
        )

    def advance(self, batch: int, next_tokens: torch.Tensor, source: torch.Tensor | None = None) -> None:
        """Appends ``next_tokens`` [B] to rows [0, batch). ``source`` [B]: the row whose history each row now
        continues (a beam may extend another row's beam); None: each its own."""
        last, last_timestamp = self.tokens[:batch], self.last_timestamp[:batch]
        if source is not None:
            last, last_timestamp = last[source], last_timestamp[source]
        if self.timestamp_tokens is not None:
            is_timestamp = next_tokens >= self.timestamp_tokens.timestamp_begin
            self.last_timestamp[:batch].copy_(torch.where(is_timestamp, next_tokens, last_timestamp))
            self.previous[:batch].copy_(last)
        self.tokens[:batch].copy_(next_tokens)
        self.positions[:batch].copy_(torch.clamp(self.positions[:batch] + 1, max=self.max_positions - 1))

    def start(self, slots: torch.Tensor, owner: torch.Tensor, first: torch.Tensor, prompt_lens: torch.Tensor,
              eot_from: torch.Tensor, timestamps: torch.Tensor, temperature: torch.Tensor) -> None:
        """Sets up ``slots`` [N] for decoding after their prompt: slot i belongs to row ``owner[i]`` of the
        encode batch, whose first token, prompt length, minimum-length bound and flags are given per row."""
        self.tokens.index_copy_(0, slots, first[owner])
        self.positions.index_copy_(0, slots, prompt_lens[owner])
        self.eot_from.index_copy_(0, slots, eot_from[owner])
        self.timestamps.index_copy_(0, slots, timestamps[owner])
        self.temperature.index_copy_(0, slots, temperature[owner])
        if self.timestamp_tokens is not None:
            tb = self.timestamp_tokens.timestamp_begin
            self.previous.index_fill_(0, slots, tb)  # fewer than two tokens sampled: the rules count it a timestamp
            self.last_timestamp.index_copy_(0, slots, torch.where(first >= tb, first, torch.zeros_like(first))[owner])

    def set_first_beams(self, targets: torch.Tensor, tokens: torch.Tensor) -> None:
        """Beam rows ``targets`` take their search's first tokens instead of the prompt's argmax."""
        self.tokens.index_copy_(0, targets, tokens)
        if self.timestamp_tokens is not None:
            tb = self.timestamp_tokens.timestamp_begin
            self.last_timestamp.index_copy_(0, targets, torch.where(tokens >= tb, tokens, torch.zeros_like(tokens)))

    def release(self, slots: torch.Tensor) -> None:
        self.block_table.index_fill_(0, slots, 0)
        self.positions.index_fill_(0, slots, 0)
