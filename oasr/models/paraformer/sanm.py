"""FunASR's SANM layers: self-attention beside an FSMN memory (a depthwise convolution over the attention's
values), the encoder built from them, and the sinusoid FunASR adds to its input.

Module and parameter names mirror FunASR's checkpoints (``encoders0.0.self_attn.linear_q_k_v``,
``fsmn_block``, ``feed_forward.w_1``, ``norm1``...), so a ``model.pt`` loads by key. SenseVoice's encoder is
built from the same layers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from oasr.layers import Conv1d, LayerNorm, Linear

NORM_EPS = 1e-12  # FunASR's LayerNorm (SenseVoice's own layers keep torch's 1e-5)


def frame_mask(lengths: torch.Tensor, num_frames: int) -> torch.Tensor:
    """lengths: [B] -> bool [B, num_frames], True on each row's real frames."""
    return torch.arange(num_frames, device=lengths.device)[None, :] < lengths[:, None]


def sinusoid(num_frames: int, depth: int, device: torch.device, dtype: torch.dtype, first: int = 1) -> torch.Tensor:
    """FunASR's ``SinusoidalPositionEncoder`` at positions first..first + num_frames - 1 (a stream's chunk starts
    past 1): [num_frames, depth] in ``dtype``, sines then cosines, the timescales spaced over depth / 2 - 1 steps.
    Computed in float32 as FunASR computes it for a float32 model; FunASR computes it in the model's dtype, which
    in float16 cannot count past 2048 positions."""
    positions = torch.arange(first, first + num_frames, device=device).float()
    increment = torch.log(torch.tensor([10000.0], device=device)) / (depth / 2 - 1)
    timescales = torch.exp(torch.arange(depth / 2, device=device).float() * -increment)
    scaled = positions[:, None] * timescales[None, :]
    return torch.cat([torch.sin(scaled), torch.cos(scaled)], dim=1).to(dtype)


class FeedForward(nn.Module):
    """``PositionwiseFeedForward``: w_2(relu(w_1(x)))."""

    def __init__(self, size: int, units: int) -> None:
        super().__init__()
        self.w_1 = Linear(size, units)
        self.w_2 = Linear(units, size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_2(F.relu(self.w_1(x)))


class SANMAttention(nn.Module):
    """``MultiHeadedAttentionSANM``: attention over the frames plus the FSMN memory of its values."""

    def __init__(self, heads: int, in_size: int, size: int, kernel_size: int, shift: int = 0) -> None:
        super().__init__()
        self.heads = heads
        self.head_size = size // heads
        self.linear_q_k_v = Linear(in_size, 3 * size)
        self.linear_out = Linear(size, size)
        self.fsmn_block = Conv1d(size, size, kernel_size, groups=size, bias=False)
        left = (kernel_size - 1) // 2 + max(shift, 0)
        self.padding = (left, kernel_size - 1 - left)

    def fsmn(self, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """values: [B, T, D]; mask: float [B, T, 1] -> the memory [B, T, D], zero past each row's frames."""
        values = values * mask
        memory = self.fsmn_block(F.pad(values.transpose(1, 2), self.padding)).transpose(1, 2)
        return (memory + values) * mask

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x: [B, T, in_size]; mask: bool [B, T] -> [B, T, size]."""
        b, t, _ = x.shape
        q, k, v = self.linear_q_k_v(x).chunk(3, dim=-1)
        memory = self.fsmn(v, mask[:, :, None].to(x.dtype))
        q, k, v = (h.reshape(b, t, self.heads, self.head_size).transpose(1, 2) for h in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :])
        return self.linear_out(attended.transpose(1, 2).reshape(b, t, -1)) + memory


class SANMEncoderLayer(nn.Module):
    """``EncoderLayerSANM`` (pre-norm): the attention's residual is kept only where input and output widths
    agree (the first layer reads the wider LFR frames and has none)."""

    def __init__(self, in_size: int, size: int, heads: int, units: int, kernel_size: int, shift: int,
                 norm_eps: float = NORM_EPS) -> None:
        super().__init__()
        self.self_attn = SANMAttention(heads, in_size, size, kernel_size, shift)
        self.feed_forward = FeedForward(size, units)
        self.norm1 = LayerNorm(in_size, eps=norm_eps)
        self.norm2 = LayerNorm(size, eps=norm_eps)
        self.residual = in_size == size

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        attended = self.self_attn(self.norm1(x), mask)
        x = x + attended if self.residual else attended
        return x + self.feed_forward(self.norm2(x))


class SANMEncoder(nn.Module):
    """``SANMEncoder`` with ``input_layer: pe``: input scaled by sqrt(output_size), sinusoid added, then
    ``encoders0`` (one layer from the input width), ``encoders`` and ``after_norm``."""

    def __init__(self, input_size: int, output_size: int, heads: int, units: int, num_blocks: int,
                 kernel_size: int, shift: int, norm_eps: float = NORM_EPS) -> None:
        super().__init__()
        self.output_size = output_size
        self.encoders0 = nn.ModuleList(
            [SANMEncoderLayer(input_size, output_size, heads, units, kernel_size, shift, norm_eps)])
        self.encoders = nn.ModuleList(SANMEncoderLayer(output_size, output_size, heads, units, kernel_size, shift,
                                                       norm_eps) for _ in range(num_blocks - 1))
        self.after_norm = LayerNorm(output_size, eps=norm_eps)

    def embed(self, features: torch.Tensor) -> torch.Tensor:
        """features: [B, T, input_size] -> the first layer's input: scaled, positions added."""
        x = features * self.output_size**0.5
        return x + sinusoid(x.shape[1], x.shape[2], x.device, x.dtype)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """x: [B, T, input_size] embedded (``embed``); lengths: [B] -> [B, T, output_size]."""
        mask = frame_mask(lengths, x.shape[1])
        for layer in (*self.encoders0, *self.encoders):
            x = layer(x, mask)
        return self.after_norm(x)
