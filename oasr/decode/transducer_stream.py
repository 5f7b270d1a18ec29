"""Greedy RNN-T over a stream's chunk: the label loop of ``transducer_greedy``, continued from the predictor
context the stream's previous chunk left (not from the start of a sequence), for a batch of streams at once.

A row leaves a chunk only by moving past its last frame, so decoding a stream chunk by chunk gives the tokens of
decoding all its frames at once. Each token comes back with the frame it was emitted on, which endpointing reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from oasr.decode.transducer_greedy import TransducerModel, _Loop, greedy_rule, run_steps


@dataclass
class ChunkTokens:
    token_ids: list[list[int]]  # per row, the tokens emitted in this chunk
    token_frames: list[list[int]]  # per row, the chunk frame each token was emitted on
    predictor_out: torch.Tensor  # [B, H] the context after the chunk
    state: Any  # the predictor's state after the chunk


def decode_chunk(
    model: TransducerModel, frames: torch.Tensor, predictor_out: torch.Tensor, state: Any, *, max_symbols: int,
    lengths: torch.Tensor | None = None,
) -> ChunkTokens:
    """frames: [B, T, H] projected encoder frames of every row's chunk; predictor_out [B, H] and ``state``: each
    row's context (updated in place); lengths: [B] the frames of each row to decode (the first ones; None: all
    T) -> the chunk's tokens and the context after it."""
    if lengths is None:
        lengths = torch.full((frames.shape[0],), frames.shape[1], dtype=torch.long, device=frames.device)
    loop = _Loop.resume(frames, lengths, predictor_out, state, max_symbols, keep_frames=True)
    run_steps(model, loop, greedy_rule(model), max_symbols=max_symbols, max_advance=1)
    width = loop.tokens.shape[1]
    read = torch.cat([loop.count[:, None], loop.tokens, loop.token_frames], dim=1).tolist()  # the one read
    token_ids = [row[1 : 1 + row[0]] for row in read]
    token_frames = [row[1 + width : 1 + width + row[0]] for row in read]
    return ChunkTokens(token_ids, token_frames, loop.predictor_out, loop.state)
