"""Continuous integrate-and-fire (CIF), FunASR's ``CifPredictorV2``, batched.

Each encoder frame gets a weight alpha in [0, 1]; walking the frames, the weights add up, and each time the sum
crosses a whole number a token "fires": its acoustic embedding is the alpha-weighted sum of the frames since the
last fire, the crossing frame split between the two tokens. The number of tokens is the floor of the weights'
sum (after a ``tail_threshold`` of weight is added just past each input, so a last partial token can fire), and
the fire positions are the tokens' timestamps (``oasr.models.paraformer.timestamps``).

FunASR computes the running sums in float64 and casts them to float32, and the embeddings as differences of a
running sum of weighted frames; the same arithmetic is kept here so that the two give the same tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from oasr.layers import Conv1d, Linear
from oasr.models.paraformer.config import CifPredictorConfig
from oasr.models.paraformer.sanm import frame_mask


@dataclass
class CifOutput:
    """embeds: [B, L, D] acoustic embeddings (L: the most tokens of a row); token_counts: int64 [B];
    alphas: [B, T + 1] frame weights (the tail's included); fires: [B, T + 1] FunASR's ``cif_peak`` (1 plus the
    running sum's fraction where a token fires, the fraction elsewhere)."""

    embeds: torch.Tensor
    token_counts: torch.Tensor
    alphas: torch.Tensor
    fires: torch.Tensor


class CifPredictor(nn.Module):
    def __init__(self, config: CifPredictorConfig) -> None:
        super().__init__()
        self.config = config
        self.cif_conv1d = Conv1d(config.idim, config.idim, config.l_order + config.r_order + 1)
        self.cif_output = Linear(config.idim, 1)

    def weights(self, hidden: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """hidden: [B, T, D]; lengths: [B] -> alphas [B, T] (float32, zero past each row)."""
        c = self.config
        inside = frame_mask(lengths, hidden.shape[1])
        # Zero past each row: the convolution at a row's last frames must read the zeros a batch of one pads with.
        context = F.pad((hidden * inside[:, :, None]).transpose(1, 2), (c.l_order, c.r_order))
        output = torch.relu(self.cif_conv1d(context)).transpose(1, 2)
        alphas = torch.sigmoid(self.cif_output(output).float()).squeeze(-1)
        alphas = torch.relu(alphas * c.smooth_factor - c.noise_threshold)
        return alphas * inside

    def forward(self, hidden: torch.Tensor, lengths: torch.Tensor) -> CifOutput:
        """hidden: [B, T, D] encoder frames; lengths: [B] -> the tokens' embeddings, counts, weights, fires."""
        c = self.config
        inside = frame_mask(lengths, hidden.shape[1])
        alphas = self.weights(hidden, lengths)
        # Frames past a row are zeroed: the tail's weight lands on the first of them, which must weigh as the
        # zero frame FunASR appends to a batch of one, whatever the row is batched with.
        hidden = hidden.float() * inside[:, :, None]
        hidden = F.pad(hidden, (0, 0, 0, 1))
        if c.tail_threshold > 0:
            tail = frame_mask(lengths + 1, hidden.shape[1]) & ~F.pad(inside, (0, 1))
            alphas = F.pad(alphas, (0, 1)) + c.tail_threshold * tail
            token_counts = torch.floor(alphas.sum(dim=-1))
        else:
            alphas = F.pad(alphas, (0, 1))
            token_counts = torch.round(alphas.sum(dim=-1))
        embeds, fires = integrate_and_fire(hidden, alphas)
        num_tokens = int(token_counts.max()) if token_counts.numel() else 0
        return CifOutput(embeds[:, :num_tokens], token_counts.long(), alphas, fires)


def integrate_and_fire(hidden: torch.Tensor, alphas: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """hidden: float32 [B, T, D]; alphas: [B, T] -> (embeds [B, L, D] with L = round(max row sum), fires [B, T]).

    FunASR's ``cif_v1`` with a threshold of 1: a token fires at frame t when floor(running sum) steps up there.
    """
    batch, _, size = hidden.shape
    running = torch.cumsum(alphas, dim=1, dtype=torch.float64).float()
    whole = torch.floor(running)
    fired = (whole - F.pad(whole[:, :-1], (1, 0))) > 0  # [B, T]
    fires = fired.float() + running - whole
    weighted = torch.cumsum(alphas[:, :, None] * hidden, dim=1)  # [B, T, D]
    remains = fires - torch.floor(fires)
    # Each fire's embedding: the running weighted sum since the previous fire of its row, moved by the two
    # crossing frames' shares (what the crossing frame gives the next token). Fires are taken in (row, frame)
    # order, as FunASR's boolean indexing takes them, and the terms are added in FunASR's order.
    rows, frames = fired.nonzero(as_tuple=True)
    first = torch.ones_like(rows, dtype=torch.bool)
    first[1:] = rows[1:] != rows[:-1]
    at_fire = weighted[rows, frames]
    share = remains[rows, frames][:, None] * hidden[rows, frames]
    before = torch.roll(at_fire, 1, dims=0).masked_fill(first[:, None], 0.0)
    share_before = torch.roll(share, 1, dims=0).masked_fill(first[:, None], 0.0)
    embeds_flat = at_fire - before + share_before - share
    max_tokens = int(torch.round(alphas.sum(dim=-1)).max()) if batch else 0
    rank = torch.cumsum(fired.long(), dim=1)[rows, frames] - 1
    keep = rank < max_tokens
    embeds = hidden.new_zeros(batch, max_tokens, size)
    embeds[rows[keep], rank[keep]] = embeds_flat[keep]
    return embeds, fires
