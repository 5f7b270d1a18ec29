"""FunASR's ``ConformerEncoder`` as its released configs build it: conv2d subsampling (4x), ESPnet's legacy relative
positions, pre-norm Conformer blocks (half-step macaron feed-forward, self-attention, convolution module,
feed-forward, final norm) and ``after_norm``. Module names mirror FunASR's keys (``encoder.embed.conv.0``,
``encoders.N.self_attn.linear_q``, ``conv_module.pointwise_conv1``...), so ``model.pt`` loads as stored.

Each row of a padded batch is computed as FunASR computes it alone, so that a row's output does not depend on
what it is batched with: its frame count is its own (FunASR's batched mask counts two frames more for a padded
row), the convolution module sees zeros past its end (FunASR's would read the padding), and the legacy position
term is laid out for the row's own length (see ``legacy_position_scores``).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from oasr.layers import GLU, BatchNorm1d, Conv1d, Conv2d, LayerNorm, Linear, PointwiseConv1d, ReLU, SiLU
from oasr.models.funasr_conformer.config import ConformerEncoderConfig

NORM_EPS = 1e-12  # FunASR's LayerNorm (funasr.models.transformer.layer_norm)
# ESPnet's legacy relative encoding is a table of max_len positions counted down from max_len - 1; frame m of the
# key side reads position max_len - 1 - m. FunASR builds it with max_len 5000 and rebuilds it longer only past
# 5000 frames.
LEGACY_MAX_LEN = 5000


def subsampled_lengths(lengths: torch.Tensor) -> torch.Tensor:
    """Frames of each row after two 3-wide stride-2 convolutions: [B] -> [B]."""
    return ((lengths - 1) // 2 - 1) // 2


def sinusoids(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """ESPnet's sinusoid table: positions [N] (float32) -> [N, dim], sin in even and cos in odd channels."""
    div = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32, device=positions.device) * -(math.log(10000.0) / dim))
    table = torch.zeros(positions.shape[0], dim, device=positions.device)
    table[:, 0::2] = torch.sin(positions[:, None] * div)
    table[:, 1::2] = torch.cos(positions[:, None] * div)
    return table


class Conv2dSubsampling(nn.Module):
    """``embed``: conv (1 -> D, 3, stride 2), ReLU, conv (D -> D, 3, stride 2), ReLU, then ``out.0`` flattens the
    channels and remaining mel bins into D; the frames are scaled by sqrt(D) (the positional layer's ``xscale``)."""

    def __init__(self, input_size: int, size: int) -> None:
        super().__init__()
        self.conv = nn.Sequential(Conv2d(1, size, 3, 2), ReLU(), Conv2d(size, size, 3, 2), ReLU())
        self.out = nn.Sequential(Linear(size * (((input_size - 1) // 2 - 1) // 2), size))
        self.xscale = math.sqrt(size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [B, T, input_size] -> [B, T', D]."""
        x = self.conv(x[:, None])
        b, c, t, f = x.shape
        return self.out(x.transpose(1, 2).reshape(b, t, c * f)) * self.xscale


def legacy_position_scores(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """ESPnet's legacy ``rel_shift`` of each row at its own length.

    x: [B, H, T, T], x[b, h, i, m] = query i against key-side position m -> scores [B, H, T, T] by (query i,
    key j). For a row of L frames the shift (pad a zero column, fold [L, L+1] into [L+1, L], drop the first row)
    puts x[i, L - 1 + j - i] at j <= i, zero at j = i + 1 and x[i + 1, j - i - 2] above: the lower triangle
    depends on L, so a padded row is laid out by its own L, not by the batch's T.
    """
    b, h, t, _ = x.shape
    i = torch.arange(t, device=x.device)[:, None]
    j = torch.arange(t, device=x.device)[None, :]
    lower = j <= i
    row = torch.where(lower, i, i + 1).clamp(max=t - 1).expand(b, t, t)
    col = torch.where(lower, lengths[:, None, None] - 1 + j - i, (j - i - 2).expand(b, t, t))
    flat = (row * t + col.clamp(0, t - 1)).reshape(b, 1, t * t).expand(b, h, t * t)
    scores = x.reshape(b, h, t * t).gather(2, flat).reshape(b, h, t, t)
    return scores.masked_fill((j == i + 1)[None, None], 0.0)


class LegacyRelPositionAttention(nn.Module):
    """``LegacyRelPositionMultiHeadedAttention``: (q + u) . k plus the shifted (q + v) . linear_pos(position)."""

    def __init__(self, size: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads, self.head_dim = num_heads, size // num_heads
        self.linear_q = Linear(size, size)
        self.linear_k = Linear(size, size)
        self.linear_v = Linear(size, size)
        self.linear_out = Linear(size, size)
        self.linear_pos = Linear(size, size, bias=False)
        self.pos_bias_u = nn.Parameter(torch.zeros(num_heads, self.head_dim))
        self.pos_bias_v = nn.Parameter(torch.zeros(num_heads, self.head_dim))

    def heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(x.shape[0], x.shape[1], self.num_heads, self.head_dim)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, lengths: torch.Tensor,
                key_mask: torch.Tensor) -> torch.Tensor:
        """x: [B, T, D]; positions: [1, T, D] (the legacy table's first T rows); key_mask: bool [B, 1, 1, T]."""
        q = self.heads(self.linear_q(x))
        k = self.heads(self.linear_k(x)).transpose(1, 2)
        v = self.heads(self.linear_v(x)).transpose(1, 2)
        p = self.heads(self.linear_pos(positions)).transpose(1, 2)
        content = torch.matmul((q + self.pos_bias_u).transpose(1, 2), k.transpose(-2, -1))
        position = legacy_position_scores(torch.matmul((q + self.pos_bias_v).transpose(1, 2), p.transpose(-2, -1)),
                                          lengths)
        scores = ((content + position) / math.sqrt(self.head_dim)).masked_fill(~key_mask, float("-inf"))
        out = torch.matmul(torch.softmax(scores, dim=-1), v)
        return self.linear_out(out.transpose(1, 2).reshape(x.shape))


class FeedForward(nn.Module):
    """``PositionwiseFeedForward``: w_2(activation(w_1(x)))."""

    def __init__(self, size: int, hidden: int, activation: nn.Module) -> None:
        super().__init__()
        self.w_1 = Linear(size, hidden)
        self.w_2 = Linear(hidden, size)
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_2(self.activation(self.w_1(x)))


class ConvolutionModule(nn.Module):
    """Pointwise conv to 2D, GLU, depthwise conv, batch norm, swish, pointwise conv; frames past a row's end are
    zeroed before the depthwise conv, as that conv's own padding would be for the row alone."""

    def __init__(self, size: int, kernel_size: int) -> None:
        super().__init__()
        self.pointwise_conv1 = PointwiseConv1d(size, 2 * size)
        self.glu = GLU(dim=-1)
        self.depthwise_conv = Conv1d(size, size, kernel_size, padding=(kernel_size - 1) // 2, groups=size)
        self.norm = BatchNorm1d(size)
        self.activation = SiLU()
        self.pointwise_conv2 = PointwiseConv1d(size, size)

    def forward(self, x: torch.Tensor, frame_mask: torch.Tensor) -> torch.Tensor:
        """x: [B, T, D]; frame_mask: bool [B, T, 1] -> [B, T, D]."""
        x = self.glu(self.pointwise_conv1(x)).masked_fill(~frame_mask, 0.0)
        x = self.activation(self.norm(self.depthwise_conv(x.transpose(1, 2))))
        return self.pointwise_conv2(x.transpose(1, 2))


class ConformerLayer(nn.Module):
    """FunASR's Conformer ``EncoderLayer`` (pre-norm, no concat_after)."""

    def __init__(self, c: ConformerEncoderConfig) -> None:
        super().__init__()
        size = c.output_size
        self.self_attn = LegacyRelPositionAttention(size, c.attention_heads)
        self.feed_forward = FeedForward(size, c.linear_units, SiLU())
        self.feed_forward_macaron = FeedForward(size, c.linear_units, SiLU()) if c.macaron_style else None
        self.conv_module = ConvolutionModule(size, c.cnn_module_kernel) if c.use_cnn_module else None
        self.norm_ff = LayerNorm(size, eps=NORM_EPS)
        self.norm_mha = LayerNorm(size, eps=NORM_EPS)
        if c.macaron_style:
            self.norm_ff_macaron = LayerNorm(size, eps=NORM_EPS)
        if c.use_cnn_module:
            self.norm_conv = LayerNorm(size, eps=NORM_EPS)
            self.norm_final = LayerNorm(size, eps=NORM_EPS)
        # A macaron block splits its feed-forward in two half steps.
        self.ff_scale = 0.5 if c.macaron_style else 1.0

    def forward(self, x: torch.Tensor, positions: torch.Tensor, lengths: torch.Tensor, key_mask: torch.Tensor,
                frame_mask: torch.Tensor) -> torch.Tensor:
        if self.feed_forward_macaron is not None:
            x = x + self.ff_scale * self.feed_forward_macaron(self.norm_ff_macaron(x))
        x = x + self.self_attn(self.norm_mha(x), positions, lengths, key_mask)
        if self.conv_module is not None:
            x = x + self.conv_module(self.norm_conv(x), frame_mask)
        x = x + self.ff_scale * self.feed_forward(self.norm_ff(x))
        return self.norm_final(x) if self.conv_module is not None else x


class ConformerEncoder(nn.Module):
    def __init__(self, c: ConformerEncoderConfig) -> None:
        super().__init__()
        self.config = c
        self.embed = Conv2dSubsampling(c.input_size, c.output_size)
        self.encoders = nn.ModuleList(ConformerLayer(c) for _ in range(c.num_blocks))
        self.after_norm = LayerNorm(c.output_size, eps=NORM_EPS)

    def positions(self, num_frames: int, device: torch.device) -> torch.Tensor:
        """The legacy table's first ``num_frames`` rows: positions max_len - 1, max_len - 2, ... -> [1, T, D]."""
        top = max(LEGACY_MAX_LEN, num_frames) - 1
        steps = torch.arange(num_frames, device=device, dtype=torch.float32)
        return sinusoids(top - steps, self.config.output_size)[None]

    def forward(self, features: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """features: [B, T, input_size]; lengths: [B] -> (frames [B, T', D], their lengths [B])."""
        x = self.embed(features)
        lengths = subsampled_lengths(lengths.to(x.device)).clamp(min=0)
        t = x.shape[1]
        valid = torch.arange(t, device=x.device)[None, :] < lengths[:, None]
        positions = self.positions(t, x.device).to(x.dtype)
        for layer in self.encoders:
            x = layer(x, positions, lengths, valid[:, None, None, :], valid[..., None])
        return self.after_norm(x), lengths
