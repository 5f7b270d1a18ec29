"""The FastConformer convolution subsampling's strided convolutions, channels last, in two kernels.

In plain torch (NCHW through cuDNN) the stack's first convolution (1 -> C channels, stride S) writes the largest
activation of the whole encoder, [B, C, T/S, F/S], then adds its bias, applies ReLU and zeroes padded frames in
further passes, and the depthwise convolutions convert layouts on the way in and out. Here:

- ``first_conv_depthwise``: the first convolution + bias + ReLU, recomputed per tap of the first depthwise
  convolution that reads it (it never goes to memory; each recomputation is a small matrix multiply on tensor
  cores, the input's K*K taps against the [K*K, C] weights), then that depthwise convolution + bias. Features
  [B, T, F] -> [B, T'', F'', C] with channels the contiguous axis, ready for the pointwise convolution, which is
  a matrix multiply in this layout.
- ``relu_depthwise``: ReLU of a pointwise convolution's output, then the next depthwise convolution + bias,
  [B, T, F, C] -> [B, T', F', C].

Padding: frames past a row's length are zero wherever a convolution reads them (input features, the first
convolution's output, each pointwise output), exactly as the torch stack arranges; the frequency axis has plain
zero padding. Both kernels write zeros at output frames past the row's new length, so the result is defined
everywhere and the same whatever the batch is padded to. Weights come as float32 taps [K, K, C]
(``channels_last_taps``). Sums are float32; the first convolution multiplies in the features' dtype (its weights
rounded to it, a no-op for a model's own), the rest in float32.

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
    """One program's share of the output: ``positions`` (frame, frequency) pairs x ``channels`` channels, both
    powers of two (at least 16 for ``first_conv_depthwise``, whose matrix multiplies need it)."""

    positions: int
    channels: int
    num_warps: int = 4


# Register-light choices that compile without spills on sm_90; scripts/bench_subsampling.py --sweep times others.
FIRST_TILE, DEPTHWISE_TILE = Tile(64, 64), Tile(32, 64)


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
    # The kernel multiplies the first convolution's weights in the features' dtype (a model's own weights are
    # stored in it, so this rounds nothing for them).
    conv_taps, conv_bias = conv_taps.to(features.dtype).float(), conv_bias.to(features.dtype).float()
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


def padded_input(features: torch.Tensor, lengths: torch.Tensor, kernel: int, stride: int) -> torch.Tensor:
    """features [B, T, F] -> [B, T_pad, F_pad], zero past each row's length and around the edges, placed
    so that output position (t'', f'') of the two stacked convolutions reads exactly the padded window starting
    at (t'' * stride**2, f'' * stride**2): the kernel needs no bounds checks on its input."""
    pad = (kernel - 1) // 2
    halo = (stride + 1) * pad  # how far before frame 0 the two stacked convolutions read
    b, t0, f0 = features.shape
    t2 = strided_length(strided_length(t0, kernel, stride), kernel, stride)
    f2 = strided_length(strided_length(f0, kernel, stride), kernel, stride)
    window = (kernel - 1) * (stride + 1) + 1  # input frames one output reads
    t_pad, f_pad = (t2 - 1) * stride * stride + window, (f2 - 1) * stride * stride + window
    x = features.new_zeros(b, t_pad, f_pad)
    t_copy, f_copy = min(t0, t_pad - halo), min(f0, f_pad - halo)  # frames no output reads are left out
    real = torch.arange(t_copy, device=features.device)[None, :] < lengths[:, None]
    x[:, halo:halo + t_copy, halo:halo + f_copy] = features[:, :t_copy, :f_copy] * real[..., None]
    return x


def first_conv_depthwise(
    features: torch.Tensor, lengths: torch.Tensor, conv_taps: torch.Tensor, conv_bias: torch.Tensor,
    depthwise_taps: torch.Tensor, depthwise_bias: torch.Tensor, stride: int, tile: Tile = FIRST_TILE,
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
    out = torch.empty(b, max(t2, 0), max(f2, 0), channels, dtype=features.dtype, device=features.device)
    if out.numel() == 0:
        return out
    lengths = lengths.to(device=features.device, dtype=torch.int64)
    lengths1 = strided_length(lengths, kernel, stride)
    x = padded_input(features, lengths, kernel, stride)
    # The first convolution's weights as a [K*K + 1, C] matrix in the features' dtype, the bias its last row:
    # exact for a model's own weights, which are stored in that dtype. Float32 multiplies as float32 (no TF32).
    w1 = torch.cat([conv_taps.reshape(kernel * kernel, channels), conv_bias[None]]).to(features.dtype)
    grid = (b, triton.cdiv(t2 * f2, tile.positions), triton.cdiv(channels, tile.channels))
    _first_conv_depthwise_kernel[grid](
        x, lengths1, strided_length(lengths1, kernel, stride), w1, depthwise_taps, depthwise_bias, out,
        x.shape[1], t1, t2, x.shape[2], f1, f2, channels,
        KERNEL=kernel, STRIDE=stride, TAPS=max(16, triton.next_power_of_2(kernel * kernel + 1)),
        IEEE=features.dtype == torch.float32, BLOCK_P=tile.positions, BLOCK_C=tile.channels,
        num_warps=tile.num_warps,
    )
    return out


def relu_depthwise(
    x: torch.Tensor, lengths: torch.Tensor, taps: torch.Tensor, bias: torch.Tensor, stride: int,
    tile: Tile = DEPTHWISE_TILE,
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
    @triton.jit(do_not_specialize=["t_pad", "t1", "t2"])
    def _first_conv_depthwise_kernel(
        x_ptr, len1_ptr, len2_ptr, w1_ptr, w2_ptr, b2_ptr, out_ptr,
        t_pad, t1, t2, f_pad, f1, f2, channels,
        KERNEL: tl.constexpr, STRIDE: tl.constexpr, TAPS: tl.constexpr, IEEE: tl.constexpr,
        BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
    ):
        # One (row, BLOCK_P output positions in (frame, frequency) order, BLOCK_C channels) tile per program.
        # For each depthwise tap, the first convolution's outputs it reads are one small matrix multiply: the
        # K*K input taps of each position (a column of ones carries the bias) times the [taps, channels]
        # weights. Rows of positions whose first-convolution output lies past the row's length or the frequency
        # edge are all zero, so after ReLU those outputs are zero, as the depthwise convolution must see them.
        # The input is padded (padded_input): its loads need no bounds checks. Nothing but the output is written.
        PAD: tl.constexpr = (KERNEL - 1) // 2
        NUM_TAPS: tl.constexpr = KERNEL * KERNEL
        row = tl.program_id(0).to(tl.int64)
        pos = tl.program_id(1) * BLOCK_P + tl.arange(0, BLOCK_P)
        c = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
        c_ok = c < channels
        inside = tl.minimum(pos, t2 * f2 - 1)  # the last tile's spare lanes read inside the input, store nothing
        frame, freq = inside // f2, inside % f2
        real1 = tl.minimum(tl.load(len1_ptr + row), t1)  # first-convolution frames read as computed; zero beyond
        real2 = tl.load(len2_ptr + row)
        acc = tl.zeros((BLOCK_P, BLOCK_C), dtype=tl.float32)
        # A tile wholly past the row's output frames is only written (with zeros).
        if (tl.program_id(1) * BLOCK_P) // f2 < real2:
            tap = tl.arange(0, TAPS)
            is_tap, is_bias = tap < NUM_TAPS, tap == NUM_TAPS
            w1 = tl.load(w1_ptr + tap[:, None] * channels + c[None, :],
                         mask=(tap <= NUM_TAPS)[:, None] & c_ok[None, :], other=0.0)
            window = x_ptr + row * t_pad * f_pad + (frame * f_pad + freq) * (STRIDE * STRIDE)
            for i in range(KERNEL):
                h_frame = frame * STRIDE - PAD + i
                h_frame_ok = (h_frame >= 0) & (h_frame < real1)
                for j in range(KERNEL):
                    h_freq = freq * STRIDE - PAD + j
                    h_ok = (h_frame_ok & (h_freq >= 0) & (h_freq < f1))[:, None]
                    at = window[:, None] + ((i * STRIDE + tap // KERNEL) * f_pad + j * STRIDE + tap % KERNEL)[None, :]
                    taps = tl.load(at, mask=h_ok & is_tap[None, :], other=0.0)
                    taps = tl.where(h_ok & is_bias[None, :], 1.0, taps).to(w1.dtype)
                    if IEEE:
                        h = tl.dot(taps, w1, input_precision="ieee")
                    else:
                        h = tl.dot(taps, w1)
                    w2 = tl.load(w2_ptr + (i * KERNEL + j) * channels + c, mask=c_ok, other=0.0)
                    acc += tl.maximum(h, 0.0) * w2[None, :]
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
