"""The FastConformer convolution subsampling's strided convolutions, channels last, in two kernels.

In plain torch (NCHW through cuDNN) the stack's first convolution (1 -> C channels, stride S) writes the largest
activation of the whole encoder, [B, C, T/S, F/S], then adds its bias, applies ReLU and zeroes padded frames in
further passes, and the depthwise convolutions convert layouts on the way in and out. Here:

- ``first_conv_depthwise``: the first convolution + bias + ReLU, recomputed per tap of the first depthwise
  convolution that reads it (it never goes to memory), then that depthwise convolution + bias. Features
  [B, T, F] -> [B, T'', F'', C] with channels the contiguous axis, ready for the pointwise convolution, which is
  a matrix multiply in this layout.
- ``relu_depthwise``: ReLU of a pointwise convolution's output, then the next depthwise convolution + bias,
  [B, T, F, C] -> [B, T', F', C].

Padding: frames past a row's length are zero wherever a convolution reads them (input features, the first
convolution's output, each pointwise output), exactly as the torch stack arranges; the frequency axis has plain
zero padding. Both kernels write zeros at output frames past the row's new length, so the result is defined
everywhere and the same whatever the batch is padded to. Arithmetic is float32; weights come as float32 taps
[K, K, C] (``channels_last_taps``).

The ``*_reference`` functions are the same arithmetic in torch: the equivalence tests compare the two, and they
run wherever Triton cannot.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from oasr.kernels.runtime import triton_runs_on

try:
    import triton
    import triton.language as tl
except ImportError:  # the torch references serve
    triton = None

DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@dataclass(frozen=True)
class Tile:
    """One program's share of the output: ``positions`` (frame, frequency) pairs x ``channels`` channels."""

    positions: int = 32
    channels: int = 128
    num_warps: int = 4


DEFAULT_TILE = Tile()


def channels_last_taps(conv_weight: torch.Tensor) -> torch.Tensor:
    """A convolution weight with one input channel per group, [C, 1, K, K] -> float32 [K, K, C]."""
    return conv_weight.detach().float()[:, 0].permute(1, 2, 0).contiguous()


def strided_length(length, kernel: int, stride: int):  # int or tensor: the arithmetic is the same
    """Output length of a convolution with 'same'-style padding (kernel - 1) // 2."""
    return (length + 2 * ((kernel - 1) // 2) - kernel) // stride + 1


def _zero_frames_from(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """x: [B, C, T, F] -> x with every frame t >= lengths[b] zeroed."""
    real = torch.arange(x.shape[2], device=x.device)[None, :] < lengths[:, None]
    return x * real[:, None, :, None].to(x.dtype)


def _depthwise(x: torch.Tensor, taps: torch.Tensor, bias: torch.Tensor, stride: int) -> torch.Tensor:
    kernel = taps.shape[0]
    weight = taps.permute(2, 0, 1)[:, None]
    return F.conv2d(x, weight, bias, stride=stride, padding=(kernel - 1) // 2, groups=taps.shape[2])


def first_conv_depthwise_reference(
    features: torch.Tensor, lengths: torch.Tensor, conv_taps: torch.Tensor, conv_bias: torch.Tensor,
    depthwise_taps: torch.Tensor, depthwise_bias: torch.Tensor, stride: int,
) -> torch.Tensor:
    """features: [B, T, F]; lengths: [B]; taps: float32 [K, K, C]; biases: float32 [C]
    -> [B, T'', F'', C] in features' dtype: depthwise(relu(conv(features)) zeroed past its length) + bias, zero
    past the output length."""
    kernel = conv_taps.shape[0]
    x = _zero_frames_from(features.float()[:, None], lengths)
    x = F.conv2d(x, conv_taps.permute(2, 0, 1)[:, None], conv_bias, stride=stride, padding=(kernel - 1) // 2)
    lengths = strided_length(lengths, kernel, stride)
    x = _depthwise(_zero_frames_from(x.relu(), lengths), depthwise_taps, depthwise_bias, stride)
    x = _zero_frames_from(x, strided_length(lengths, kernel, stride))
    return x.permute(0, 2, 3, 1).to(features.dtype)


def relu_depthwise_reference(
    x: torch.Tensor, lengths: torch.Tensor, taps: torch.Tensor, bias: torch.Tensor, stride: int
) -> torch.Tensor:
    """x: [B, T, F, C]; lengths: [B] (x's real frames); taps: float32 [K, K, C]; bias: float32 [C]
    -> [B, T', F', C] in x's dtype: depthwise(relu(x) zeroed past lengths) + bias, zero past the output length."""
    y = _zero_frames_from(x.float().permute(0, 3, 1, 2).relu(), lengths)
    y = _depthwise(y, taps, bias, stride)
    y = _zero_frames_from(y, strided_length(lengths, taps.shape[0], stride))
    return y.permute(0, 2, 3, 1).to(x.dtype)


def supported(x: torch.Tensor) -> bool:
    """Whether the Triton kernels run for activations like ``x`` (the references serve otherwise)."""
    return x.dtype in DTYPES and triton_runs_on(x)


def _check_taps(taps: torch.Tensor, bias: torch.Tensor, channels: int | None = None) -> None:
    if taps.dim() != 3 or taps.shape[0] != taps.shape[1] or taps.dtype != torch.float32:
        raise ValueError(f"expected float32 taps [K, K, C], got {taps.dtype} {tuple(taps.shape)}")
    if bias.shape != taps.shape[2:] or (channels is not None and taps.shape[2] != channels):
        raise ValueError(f"taps {tuple(taps.shape)} and bias {tuple(bias.shape)} do not match {channels} channels")


def first_conv_depthwise(
    features: torch.Tensor, lengths: torch.Tensor, conv_taps: torch.Tensor, conv_bias: torch.Tensor,
    depthwise_taps: torch.Tensor, depthwise_bias: torch.Tensor, stride: int, tile: Tile = DEFAULT_TILE,
) -> torch.Tensor:
    """``first_conv_depthwise_reference`` in one kernel where ``supported``; the reference elsewhere."""
    if not supported(features):
        return first_conv_depthwise_reference(
            features, lengths, conv_taps, conv_bias, depthwise_taps, depthwise_bias, stride)
    _check_taps(conv_taps, conv_bias)
    _check_taps(depthwise_taps, depthwise_bias, conv_taps.shape[2])
    kernel, channels = conv_taps.shape[0], conv_taps.shape[2]
    if depthwise_taps.shape[0] != kernel:
        raise ValueError(f"the depthwise convolution's kernel {depthwise_taps.shape[0]} is not {kernel}")
    b, t0, f0 = features.shape
    t1, f1 = strided_length(t0, kernel, stride), strided_length(f0, kernel, stride)
    t2, f2 = strided_length(t1, kernel, stride), strided_length(f1, kernel, stride)
    lengths = lengths.to(device=features.device, dtype=torch.int64)
    lengths1 = strided_length(lengths, kernel, stride)
    out = torch.empty(b, max(t2, 0), max(f2, 0), channels, dtype=features.dtype, device=features.device)
    if out.numel() == 0:
        return out
    grid = (b, triton.cdiv(t2 * f2, tile.positions), triton.cdiv(channels, tile.channels))
    _first_conv_depthwise_kernel[grid](
        features.contiguous(), lengths, lengths1, strided_length(lengths1, kernel, stride),
        conv_taps, conv_bias, depthwise_taps, depthwise_bias, out,
        t0, t1, t2, f0, f1, f2, channels,
        KERNEL=kernel, STRIDE=stride, BLOCK_P=tile.positions, BLOCK_C=tile.channels,
        num_warps=tile.num_warps,
    )
    return out


def relu_depthwise(
    x: torch.Tensor, lengths: torch.Tensor, taps: torch.Tensor, bias: torch.Tensor, stride: int,
    tile: Tile = DEFAULT_TILE,
) -> torch.Tensor:
    """``relu_depthwise_reference`` in one kernel where ``supported``; the reference elsewhere."""
    if not supported(x):
        return relu_depthwise_reference(x, lengths, taps, bias, stride)
    b, t, f, channels = x.shape
    _check_taps(taps, bias, channels)
    kernel = taps.shape[0]
    t_out, f_out = strided_length(t, kernel, stride), strided_length(f, kernel, stride)
    lengths = lengths.to(device=x.device, dtype=torch.int64)
    out = torch.empty(b, max(t_out, 0), max(f_out, 0), channels, dtype=x.dtype, device=x.device)
    if out.numel() == 0:
        return out
    grid = (b, triton.cdiv(t_out * f_out, tile.positions), triton.cdiv(channels, tile.channels))
    _relu_depthwise_kernel[grid](
        x.contiguous(), lengths, strided_length(lengths, kernel, stride), taps, bias, out,
        t, t_out, f, f_out, channels,
        KERNEL=kernel, STRIDE=stride, BLOCK_P=tile.positions, BLOCK_C=tile.channels,
        num_warps=tile.num_warps,
    )
    return out


if triton is not None:

    # Frame counts change with every batch; not specialising on them keeps one compiled variant per model.
    @triton.jit(do_not_specialize=["t0", "t1", "t2"])
    def _first_conv_depthwise_kernel(
        x_ptr, len0_ptr, len1_ptr, len2_ptr, w1_ptr, b1_ptr, w2_ptr, b2_ptr, out_ptr,
        t0, t1, t2, f0, f1, f2, channels,
        KERNEL: tl.constexpr, STRIDE: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
    ):
        # One (row, BLOCK_P output positions in (frame, frequency) order, BLOCK_C channels) tile per program.
        # Each depthwise tap recomputes the first convolution's output it reads from the single-channel input
        # (loaded once per position and shared by all channels); that output never leaves registers.
        PAD: tl.constexpr = (KERNEL - 1) // 2
        row = tl.program_id(0).to(tl.int64)
        pos = tl.program_id(1) * BLOCK_P + tl.arange(0, BLOCK_P)
        c = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
        c_ok = c < channels
        frame, freq = pos // f2, pos % f2
        real0 = tl.minimum(tl.load(len0_ptr + row), t0)  # input frames read as features; zero beyond
        real1 = tl.minimum(tl.load(len1_ptr + row), t1)  # first-convolution frames read as computed; zero beyond
        real2 = tl.load(len2_ptr + row)
        acc = tl.zeros((BLOCK_P, BLOCK_C), dtype=tl.float32)
        # A tile wholly past the row's output frames is only written (with zeros).
        if (tl.program_id(1) * BLOCK_P) // f2 < real2:
            x_row = x_ptr + row * t0 * f0
            b1 = tl.load(b1_ptr + c, mask=c_ok, other=0.0)
            for i in tl.static_range(KERNEL):
                h_frame = frame * STRIDE - PAD + i
                h_frame_ok = (h_frame >= 0) & (h_frame < real1)
                for j in tl.static_range(KERNEL):
                    h_freq = freq * STRIDE - PAD + j
                    h_ok = h_frame_ok & (h_freq >= 0) & (h_freq < f1)
                    h = tl.zeros((BLOCK_P, BLOCK_C), dtype=tl.float32) + b1[None, :]
                    for u in tl.static_range(KERNEL):
                        x_frame = h_frame * STRIDE - PAD + u
                        x_frame_ok = (x_frame >= 0) & (x_frame < real0)
                        for v in tl.static_range(KERNEL):
                            x_freq = h_freq * STRIDE - PAD + v
                            ok = x_frame_ok & (x_freq >= 0) & (x_freq < f0)
                            value = tl.load(x_row + x_frame * f0 + x_freq, mask=ok, other=0.0).to(tl.float32)
                            w1 = tl.load(w1_ptr + (u * KERNEL + v) * channels + c, mask=c_ok, other=0.0)
                            h += value[:, None] * w1[None, :]
                    h = tl.where(h_ok[:, None], tl.maximum(h, 0.0), 0.0)
                    w2 = tl.load(w2_ptr + (i * KERNEL + j) * channels + c, mask=c_ok, other=0.0)
                    acc += h * w2[None, :]
            acc += tl.load(b2_ptr + c, mask=c_ok, other=0.0)[None, :]
            acc = tl.where((frame < real2)[:, None], acc, 0.0)
        dest = out_ptr + (row * t2 * f2 + pos)[:, None] * channels + c[None, :]
        tl.store(dest, acc.to(out_ptr.dtype.element_ty), mask=(pos < t2 * f2)[:, None] & c_ok[None, :])

    @triton.jit(do_not_specialize=["t_in", "t_out"])
    def _relu_depthwise_kernel(
        x_ptr, len_in_ptr, len_out_ptr, w_ptr, b_ptr, out_ptr,
        t_in, t_out, f_in, f_out, channels,
        KERNEL: tl.constexpr, STRIDE: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
    ):
        PAD: tl.constexpr = (KERNEL - 1) // 2
        row = tl.program_id(0).to(tl.int64)
        pos = tl.program_id(1) * BLOCK_P + tl.arange(0, BLOCK_P)
        c = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
        c_ok = c < channels
        frame, freq = pos // f_out, pos % f_out
        real_in = tl.minimum(tl.load(len_in_ptr + row), t_in)
        real_out = tl.load(len_out_ptr + row)
        acc = tl.zeros((BLOCK_P, BLOCK_C), dtype=tl.float32)
        if (tl.program_id(1) * BLOCK_P) // f_out < real_out:
            x_row = x_ptr + row * t_in * f_in * channels
            for i in tl.static_range(KERNEL):
                src_frame = frame * STRIDE - PAD + i
                frame_ok = (src_frame >= 0) & (src_frame < real_in)
                for j in tl.static_range(KERNEL):
                    src_freq = freq * STRIDE - PAD + j
                    ok = frame_ok & (src_freq >= 0) & (src_freq < f_in)
                    at = x_row + (src_frame * f_in + src_freq)[:, None] * channels + c[None, :]
                    value = tl.load(at, mask=ok[:, None] & c_ok[None, :], other=0.0).to(tl.float32)
                    w = tl.load(w_ptr + (i * KERNEL + j) * channels + c, mask=c_ok, other=0.0)
                    acc += tl.maximum(value, 0.0) * w[None, :]
            acc += tl.load(b_ptr + c, mask=c_ok, other=0.0)[None, :]
            acc = tl.where((frame < real_out)[:, None], acc, 0.0)
        dest = out_ptr + (row * t_out * f_out + pos)[:, None] * channels + c[None, :]
        tl.store(dest, acc.to(out_ptr.dtype.element_ty), mask=(pos < t_out * f_out)[:, None] & c_ok[None, :])
