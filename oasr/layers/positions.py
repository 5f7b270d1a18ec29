"""Fixed (not learned) position tables.

``SinusoidalPositions`` is NeMo's ``FixedPositionalEncoding`` as transformers' Canary decoder computes it: sines
of every timescale in the first half of the channels, cosines in the second (not interleaved), timescales
10000^(-2i / channels), the whole table scaled by 1 / sqrt(channels). The table is a non-persistent buffer:
checkpoints do not store it, and it follows the model's device and dtype.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import nn


def sinusoidal_table(length: int, channels: int) -> torch.Tensor:
    """[length, channels] float32, unscaled, with the reference's float32 arithmetic (so it matches bit for bit)."""
    if channels % 2:
        raise ValueError(f"sinusoidal positions need an even channel count, got {channels}")
    half = channels // 2
    # transformers writes the increment as log(max_timescale) / (half - 1) with max_timescale = 10000^((c-2)/c),
    # which is 2 log(10000) / c: the same geometric timescales as the original transformer's.
    increment = math.log(10000 ** ((channels - 2) / channels)) / (half - 1)
    inv_timescales = torch.exp(-increment * torch.arange(half).float())
    scaled_time = torch.arange(length)[:, None] * inv_timescales[None, :]
    return torch.cat([torch.sin(scaled_time), torch.cos(scaled_time)], dim=1)


class SinusoidalPositions(nn.Module):
    """positions: [...] int64 -> [..., channels], looked up in the fixed table (an embedding without weights)."""

    KERNEL_OP: ClassVar[str] = "embedding"

    def __init__(self, length: int, channels: int) -> None:
        super().__init__()
        self.length = length
        self.channels = channels
        self.register_buffer("table", sinusoidal_table(length, channels), persistent=False)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        # Scaled after the lookup, as the reference does, so the values round the same way.
        return self.table[positions] / math.sqrt(self.channels)


def timescale_sinusoids(length: int, channels: int, max_timescale: float = 10_000.0) -> torch.Tensor:
    """Whisper's sinusoids: [length, channels] float32, sin then cos over ``channels / 2`` timescales from 1 to
    ``max_timescale``, geometric (the increment is log(max_timescale) / (channels / 2 - 1))."""
    if channels % 2:
        raise ValueError(f"sinusoidal positions need an even channel count, got {channels}")
    half = channels // 2
    inv_timescales = torch.exp(-(math.log(max_timescale) / (half - 1)) * torch.arange(half).float())
    scaled_time = torch.arange(length)[:, None] * inv_timescales[None, :]
    return torch.cat([torch.sin(scaled_time), torch.cos(scaled_time)], dim=1)
