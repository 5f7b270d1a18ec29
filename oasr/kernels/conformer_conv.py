"""The Conformer convolution module's middle in two passes: torch's GLU, then one kernel for the padding mask,
depthwise convolution, batch norm and activation.

Between its two pointwise projections, the module in plain torch is seven passes over [B, T, C] activations
(the GLU, zeroing padded frames, a transpose for the convolution, the convolution, batch norm, the activation,
a transpose back). Here the GLU's output is read channels last, as the projection leaves it, and the kernel
writes [B, T, C] (or packed rows) ready for the second projection. Batch norm in inference is a per-channel
affine, folded into the convolution's weights and bias (``fold_batch_norm``); the kernel takes them in float32
and accumulates in float32. (The GLU is not fused into the kernel: gated per tap, its sigmoids cost more than
the extra pass.)

``glu_depthwise_conv_reference`` is the same arithmetic in torch: the equivalence test compares the two, and it
runs wherever Triton cannot (CPU tensors, activations the kernel does not have).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from oasr.kernels.runtime import triton_runs_on
from oasr.layers.frames import FrameLayout

try:
    import triton
    import triton.language as tl
except ImportError:  # the torch reference serves
    triton = None

ACTIVATIONS = {"silu": 1, "swish": 1, "relu": 2, "identity": 0}


def fold_batch_norm(
    conv_weight: torch.Tensor, conv_bias: torch.Tensor | None, norm: torch.nn.BatchNorm1d
) -> tuple[torch.Tensor, torch.Tensor]:
    """Depthwise weight [C, 1, K] and bias [C] followed by ``norm`` (running statistics) -> one convolution's
    float32 weight [C, K] and bias [C]."""
    scale = norm.weight.float() * torch.rsqrt(norm.running_var.float() + norm.eps)
    bias = conv_bias.float() if conv_bias is not None else torch.zeros_like(scale)
    weight = conv_weight.float()[:, 0, :] * scale[:, None]
    return weight.contiguous(), ((bias - norm.running_mean.float()) * scale + norm.bias.float()).contiguous()


def glu_depthwise_conv_reference(
    y: torch.Tensor, frames: FrameLayout, weight: torch.Tensor, bias: torch.Tensor, activation: str
) -> torch.Tensor:
    """y: [B, T, 2C] padded or [rows, 2C] packed, as ``frames`` says; weight: float32 [C, K]; bias: float32
    [C] -> y's layout with C channels, in y's dtype: act(depthwise_conv(glu(y) zeroed at padded frames) + bias)."""
    x = F.glu(frames.unpack(y).float(), dim=-1).masked_fill(~frames.mask[:, :, None], 0.0)
    kernel = weight.shape[1]
    x = F.conv1d(x.transpose(1, 2), weight[:, None, :], bias, padding=kernel // 2, groups=weight.shape[0])
    code = ACTIVATIONS[activation]
    x = F.silu(x) if code == 1 else F.relu(x) if code == 2 else x
    return frames.pack(x.transpose(1, 2).to(y.dtype))


def supported(y: torch.Tensor, activation: str) -> bool:
    """Whether the Triton kernel runs for ``y`` (the reference serves otherwise)."""
    return activation in ACTIVATIONS and triton_runs_on(y)


def glu_depthwise_conv(
    y: torch.Tensor, frames: FrameLayout, weight: torch.Tensor, bias: torch.Tensor, activation: str
) -> torch.Tensor:
    """``glu_depthwise_conv_reference`` as torch's GLU and one kernel where ``supported``; the reference
    elsewhere. A packed layout is read and written in place: the kernel finds each utterance's frames through its
    start and length. (Packed spare rows are left unwritten; padded frames of a padded layout are written,
    finite.)"""
    if not supported(y, activation):
        return glu_depthwise_conv_reference(y, frames, weight, bias, activation)
    two_c = y.shape[-1]
    channels, kernel = weight.shape
    if two_c != 2 * channels or kernel % 2 == 0:
        raise ValueError(f"expected y [..., 2C] with C = {channels} and an odd kernel, got {tuple(y.shape)}, K={kernel}")
    # Gated first, one sigmoid per element; gating inside the kernel takes one per tap, and measured slower.
    x = F.glu(y, dim=-1)
    out = torch.empty(*x.shape[:-1], channels, dtype=x.dtype, device=x.device)
    block_t, block_c = 16, 128
    grid = (frames.lengths.shape[0], triton.cdiv(frames.num_frames, block_t), triton.cdiv(channels, block_c))
    _depthwise_conv_kernel[grid](
        x, frames.starts, frames.lengths, weight, bias, out, frames.num_frames, channels,
        KERNEL=kernel, ACTIVATION=ACTIVATIONS[activation], PACKED=frames.is_packed, BLOCK_T=block_t,
        BLOCK_C=block_c,
    )
    return out


if triton is not None:

    @triton.jit
    def _depthwise_conv_kernel(
        x_ptr, starts_ptr, lengths_ptr, w_ptr, b_ptr, out_ptr, num_frames, channels,
        KERNEL: tl.constexpr, ACTIVATION: tl.constexpr, PACKED: tl.constexpr, BLOCK_T: tl.constexpr,
        BLOCK_C: tl.constexpr,
    ):
        # One (utterance, BLOCK_T frames, BLOCK_C channels) tile per program; each tap reloads its input frames
        # (from cache after the first). Frame t of utterance b is flattened frame starts[b] + t; frames outside
        # the utterance read as zero.
        row = tl.program_id(0)
        start = tl.load(starts_ptr + row).to(tl.int64)
        length = tl.load(lengths_ptr + row)
        first = tl.program_id(1) * BLOCK_T
        # Packed: frames past the utterance's end belong to the next one. Padded: they are written too (finite).
        limit = length if PACKED else num_frames
        if first < limit:
            t = first + tl.arange(0, BLOCK_T)
            c = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
            c_ok = c < channels
            acc = tl.zeros((BLOCK_T, BLOCK_C), dtype=tl.float32)
            for k in tl.static_range(KERNEL):
                src = t + (k - KERNEL // 2)
                m = ((src >= 0) & (src < length))[:, None] & c_ok[None, :]
                w = tl.load(w_ptr + c * KERNEL + k, mask=c_ok, other=0.0)
                at = x_ptr + (start + src)[:, None] * channels + c[None, :]
                acc += tl.load(at, mask=m, other=0.0).to(tl.float32) * w[None, :]
            acc += tl.load(b_ptr + c, mask=c_ok, other=0.0)[None, :]
            if ACTIVATION == 1:
                acc = acc * tl.sigmoid(acc)
            elif ACTIVATION == 2:
                acc = tl.maximum(acc, 0.0)
            dest = out_ptr + (start + t)[:, None] * channels + c[None, :]
            tl.store(dest, acc.to(out_ptr.dtype.element_ty), mask=(t < limit)[:, None] & c_ok[None, :])
