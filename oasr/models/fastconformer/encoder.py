"""The FastConformer encoder (Rekesh et al. 2023), module for module in the Hugging Face Parakeet key layout
(``encoder.subsampling.layers.0``, ``encoder.layers.0.self_attn.relative_k_proj`` ...).

8x depthwise-separable convolution subsampling, then Conformer blocks: half-step feed-forward, relative-position
self-attention, convolution module, half-step feed-forward (the macaron sandwich), each pre-normed.

Padding: every row's real frames give the same output whatever the batch is padded to. The padded frames a
subsampling convolution reads for a real output are zeroed before it runs, every padded frame is zeroed before the
depthwise convolution, and attention gives padded keys no weight. The output at padded frames is unspecified.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from oasr.kernels import conformer_conv, subsampling
from oasr.kernels.conformer_conv import fold_batch_norm
from oasr.layers import (
    GLU,
    BatchNorm1d,
    Conv1d,
    Conv2d,
    LayerNorm,
    Linear,
    PointwiseConv1d,
    RelPositionMultiHeadAttention,
    ReLU,
    activation,
    relative_position_embeddings,
)
from oasr.layers.basic import derived
from oasr.layers.frames import FrameLayout
from oasr.models.base import EncoderOutput
from oasr.models.fastconformer.config import FastConformerEncoderConfig


def example_features(config: FastConformerEncoderConfig, batch_size: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """Random features [B, n_mels, T] zero-padded past lengths [B] that differ per row (smoke tests)."""
    lengths = torch.tensor([64 - 16 * (i % 3) for i in range(batch_size)])
    features = torch.randn(batch_size, config.num_mel_bins, 64)
    return features * frame_mask(lengths, 64)[:, None, :], lengths


def frame_mask(lengths: torch.Tensor, num_frames: int) -> torch.Tensor:
    """lengths: [B] -> bool [B, num_frames], True on each row's first ``lengths[b]`` frames."""
    return torch.arange(num_frames, device=lengths.device)[None, :] < lengths[:, None]


class ConvSubsampling(nn.Module):
    """[B, T, n_mels] features -> [B, T / factor, hidden] frames, convolving over (time, frequency).

    ``layers`` keeps Hugging Face's order: conv, ReLU, then per further factor of the stride a depthwise conv,
    a pointwise conv and a ReLU.

    Under the ``kernels`` backend the stack runs channels last (``oasr.kernels.subsampling``): the first conv, its
    ReLU and the first depthwise conv are one Triton pass, each later ReLU + depthwise conv another, the pointwise
    convs are matrix multiplies, and ``linear`` reads its input frequency-major through a copy of its weight with
    the columns permuted to match.
    """

    KERNEL_OP: ClassVar[str] = "conv_subsampling"
    use_kernel = False  # set by oasr.layers.apply_backend

    def __init__(self, config: FastConformerEncoderConfig) -> None:
        super().__init__()
        kernel, stride = config.subsampling_conv_kernel_size, config.subsampling_conv_stride
        channels = config.subsampling_conv_channels
        self.kernel_size, self.stride, self.padding = kernel, stride, (kernel - 1) // 2
        layers: list[nn.Module] = [Conv2d(1, channels, kernel, stride=stride, padding=self.padding), ReLU()]
        for _ in range(config.num_subsampling_layers - 1):
            layers += [
                Conv2d(channels, channels, kernel, stride=stride, padding=self.padding, groups=channels),
                Conv2d(channels, channels, kernel_size=1),
                ReLU(),
            ]
        self.layers = nn.ModuleList(layers)
        num_freqs = config.num_mel_bins
        for _ in range(config.num_subsampling_layers):
            num_freqs = self.strided_length(num_freqs)
        self.linear = Linear(channels * num_freqs, config.hidden_size)

    def zero_frames_read_past_end(self, x: torch.Tensor, lengths: torch.Tensor) -> None:
        """Zeroes, in place, the padded frames of ``x`` [B, C, T, F] that a convolution of this stack reads for a
        real output frame: at most ``padding`` frames past each row's end (an output frame j < L' reads input
        frames up to stride*(L'-1) - padding + kernel - 1 <= L + padding - 1). A few small writes instead of a
        pass over the whole activation; frames further out only feed padded outputs."""
        rows = torch.arange(x.shape[0], device=x.device)
        for offset in range(self.padding):
            frame = lengths + offset
            inside = (frame < x.shape[2])[:, None, None]
            frame = frame.clamp(max=x.shape[2] - 1)
            x[rows, :, frame] = torch.where(inside, 0.0, x[rows, :, frame])

    def strided_length(self, length):  # int or tensor: the arithmetic is the same
        return subsampling.strided_length(length, self.kernel_size, self.stride)

    def forward(self, features: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """features: [B, T, n_mels] (zero past each row's length); lengths: [B] -> (frames [B, T', hidden],
        lengths [B])."""
        # The kernels' first pass needs a depthwise conv after the first conv (a factor of at least stride**2).
        # Inside torch.compile the torch path runs: the compiler fuses it itself.
        if (self.use_kernel and len(self.layers) > 2 and subsampling.supported(features)
                and not torch.compiler.is_compiling()):
            return self.channels_last_forward(features, lengths)
        x = features.unsqueeze(1)
        for layer in self.layers:
            x = layer(x)
            if isinstance(layer, Conv2d):
                if layer.stride[0] > 1:
                    lengths = self.strided_length(lengths)
                # Biases make padded frames non-zero; the next convolution must see zeros there, as a row alone would.
                self.zero_frames_read_past_end(x, lengths)
        b, channels, num_frames, num_freqs = x.shape
        return self.linear(x.transpose(1, 2).reshape(b, num_frames, channels * num_freqs)), lengths

    def kernel_weights(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(float32 taps [K, K, C], float32 bias [C]) of each strided conv, first conv first; made once and again
        only when a weight moves or is written (not in the state dict)."""
        strided = [self.layers[0], *self.layers[2::3]]  # the first conv, then each depthwise conv
        sources = tuple(t for layer in strided for t in (layer.weight, layer.bias))
        return derived(self, "_kernel_weights", sources, lambda: [
            (subsampling.channels_last_taps(layer.weight), layer.bias.detach().float()) for layer in strided
        ])

    def frequency_major_linear_weight(self) -> torch.Tensor:
        """``linear.weight`` with its input columns reordered from channel-major (c * F + f, the NCHW flattening)
        to frequency-major (f * C + c, the channels-last one)."""
        weight = self.linear.weight
        channels = self.layers[0].out_channels

        def build() -> torch.Tensor:
            w = weight.detach()
            return w.view(w.shape[0], channels, -1).transpose(1, 2).reshape(w.shape[0], -1).contiguous()

        return derived(self, "_frequency_major_linear_weight", (weight,), build)

    def channels_last_forward(self, features: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``forward`` through the subsampling kernels, [B, T, F, C] throughout: the same real frames (padded
        ones differ, unspecified on both paths)."""
        strided = self.kernel_weights()
        pointwise = self.layers[3::3]
        x = subsampling.first_conv_depthwise(features, lengths, *strided[0], *strided[1], self.stride)
        lengths = self.strided_length(self.strided_length(lengths))
        for index, layer in enumerate(pointwise):
            x = F.linear(x, layer.weight[:, :, 0, 0], layer.bias)
            if index + 2 < len(strided):
                x = subsampling.relu_depthwise(x, lengths, *strided[index + 2], self.stride)
                lengths = self.strided_length(lengths)
            else:
                x = x.relu_()
        b, num_frames, num_freqs, channels = x.shape
        if self.linear.quant_gemm is not None:  # quantized weights are not reordered: the input is, to channel-major
            return self.linear(x.transpose(2, 3).reshape(b, num_frames, channels * num_freqs)), lengths
        x = F.linear(x.reshape(b, num_frames, num_freqs * channels), self.frequency_major_linear_weight(),
                     self.linear.bias)
        return x, lengths


class FeedForward(nn.Module):
    def __init__(self, config: FastConformerEncoderConfig) -> None:
        super().__init__()
        self.linear1 = Linear(config.hidden_size, config.intermediate_size, bias=config.attention_bias)
        self.activation = activation(config.hidden_act)
        self.linear2 = Linear(config.intermediate_size, config.hidden_size, bias=config.attention_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear2.after(self.activation, self.linear1(x))


class ConvolutionModule(nn.Module):
    """Pointwise conv + GLU, depthwise conv, batch norm, activation, pointwise conv; [B, T, C] -> [B, T, C].

    Under the ``kernels`` backend, everything between the two pointwise convolutions is one Triton pass
    (``oasr.kernels.conformer_conv``) with the batch norm folded into the depthwise convolution.
    """

    KERNEL_OP: ClassVar[str] = "conformer_conv"
    use_kernel = False  # set by oasr.layers.apply_backend

    def __init__(self, config: FastConformerEncoderConfig) -> None:
        super().__init__()
        self.hidden_act = config.hidden_act
        channels, kernel, bias = config.hidden_size, config.conv_kernel_size, config.convolution_bias
        self.pointwise_conv1 = PointwiseConv1d(channels, 2 * channels, bias=bias)
        self.glu = GLU(dim=-1)
        self.depthwise_conv = Conv1d(
            channels, channels, kernel, padding=(kernel - 1) // 2, groups=channels, bias=bias
        )
        self.norm = BatchNorm1d(channels)
        self.activation = activation(config.hidden_act)
        self.pointwise_conv2 = PointwiseConv1d(channels, channels, bias=bias)

    def folded(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The depthwise convolution with the batch norm folded in: float32 weight [C, K] and bias [C], made once
        and again only when one of the tensors they come from moves or is written (not in the state dict)."""
        conv, norm = self.depthwise_conv, self.norm
        sources = (conv.weight, conv.bias, norm.weight, norm.bias, norm.running_mean, norm.running_var)
        return derived(self, "_folded", sources, lambda: fold_batch_norm(conv.weight, conv.bias, norm))

    def forward(self, x: torch.Tensor, frames: FrameLayout) -> torch.Tensor:
        """x: [B, T, C] padded or [rows, C] packed, as ``frames`` says -> the same layout."""
        y = self.pointwise_conv1(x)
        # Inside torch.compile the torch path runs: the compiler fuses it itself.
        if self.use_kernel and conformer_conv.supported(y, self.hidden_act) and not torch.compiler.is_compiling():
            return self.pointwise_conv2(conformer_conv.glu_depthwise_conv(y, frames, *self.folded(), self.hidden_act))
        x = self.glu(frames.unpack(y))
        x = x.masked_fill(~frames.mask[:, :, None], 0.0)  # the depthwise conv must not read padded frames
        x = self.activation(self.norm(self.depthwise_conv(x.transpose(1, 2))))
        return self.pointwise_conv2(frames.pack(x.transpose(1, 2)))


ConvModuleFactory = Callable[[FastConformerEncoderConfig], nn.Module]


class ConformerBlock(nn.Module):
    """``conv_module`` builds the convolution module: Parakeet's ('same' padding, batch norm) by default; it is
    called as ``conv(x, frames)`` and keeps the layout it is given."""

    def __init__(self, config: FastConformerEncoderConfig, conv_module: ConvModuleFactory = ConvolutionModule) -> None:
        super().__init__()
        d = config.hidden_size
        self.feed_forward1 = FeedForward(config)
        self.self_attn = RelPositionMultiHeadAttention(d, config.num_attention_heads, bias=config.attention_bias)
        self.conv = conv_module(config)
        self.feed_forward2 = FeedForward(config)
        self.norm_feed_forward1 = LayerNorm(d)
        self.norm_self_att = LayerNorm(d)
        self.norm_conv = LayerNorm(d)
        self.norm_feed_forward2 = LayerNorm(d)
        self.norm_out = LayerNorm(d)

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, frames: FrameLayout, pair_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """x: [B, T, C] padded or [rows, C] packed, as ``frames`` says -> the same layout. Attention sees the
        padded view; everything else works in ``x``'s layout. pair_mask: bool [T, T], the (query, key) pairs
        attention may use (None: every real key)."""
        # Macaron: two half-step feed-forwards around attention and convolution. Each residual add and the norm
        # after it are one step (one kernel under the kernels backend).
        x, h = self.norm_self_att.add_forward(x, self.feed_forward1(self.norm_feed_forward1(x)), alpha=0.5)
        attended = self.self_attn(frames.unpack(h), positions, key_mask=frames.mask, pair_mask=pair_mask)
        x, h = self.norm_conv.add_forward(x, frames.pack(attended))
        x, h = self.norm_feed_forward2.add_forward(x, self.conv(h, frames))
        return self.norm_out.add_forward(x, self.feed_forward2(h), alpha=0.5)[1]


class FastConformerEncoder(nn.Module):
    """Packs a batch's frames (``FrameLayout.packed``) when at least ``pack_from_padding`` of its padded view
    is padding and the frame counts are known on the host (``lengths`` on the CPU, as the engine passes them);
    otherwise runs padded. Both give the same real frames.

    Variants swap parts, all defaulting to Parakeet's: ``subsampling`` (a module with ``forward(features
    [B, T, n_mels], lengths)`` and ``strided_length``), ``conv_module`` (each block's convolution module) and
    ``attention_window`` (``num_frames, device -> bool [T, T]`` of the (query, key) pairs attention may use;
    None: full context).
    """

    pack_from_padding = 1 / 16

    def __init__(
        self,
        config: FastConformerEncoderConfig,
        *,
        subsampling: nn.Module | None = None,
        conv_module: ConvModuleFactory = ConvolutionModule,
        attention_window: Callable[[int, torch.device], torch.Tensor] | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        self.input_scale = math.sqrt(config.hidden_size) if config.scale_input else 1.0
        self.subsampling = subsampling if subsampling is not None else ConvSubsampling(config)
        self.layers = nn.ModuleList(ConformerBlock(config, conv_module) for _ in range(config.num_hidden_layers))
        self.attention_window = attention_window

    def output_lengths(self, lengths: torch.Tensor | int) -> torch.Tensor | int:
        """Feature frames [B] -> encoder frames [B] (or an int -> an int)."""
        for _ in range(self.config.num_subsampling_layers):
            lengths = self.subsampling.strided_length(lengths)
        return lengths

    def forward(self, features: torch.Tensor, lengths: torch.Tensor) -> EncoderOutput:
        """features: [B, n_mels, T] (as the extractor returns them); lengths: [B] real feature frames (on the
        CPU, the layout is chosen without reading the device) -> hidden [B, T', hidden_size] with
        T' = T / subsampling_factor (rounded up), lengths [B] (int64)."""
        x = features.transpose(1, 2)
        known = lengths.device.type == "cpu" and not torch.compiler.is_compiling()
        host_lengths = lengths.tolist() if known else None
        lengths = lengths.to(device=x.device, dtype=torch.long, non_blocking=True)
        # Zero the padding the caller left, so results never depend on its value.
        x = x * frame_mask(lengths, x.shape[1])[..., None].to(x.dtype)
        x, lengths = self.subsampling(x, lengths)
        x = x * self.input_scale
        positions = relative_position_embeddings(x.shape[1], x.shape[2], device=x.device, dtype=x.dtype)
        frames = self.layout(host_lengths, lengths, x.shape[1])
        x = frames.pack(x)
        pair_mask = None if self.attention_window is None else self.attention_window(frames.num_frames, x.device)
        for layer in self.layers:
            x = layer(x, positions, frames, pair_mask)
        return EncoderOutput(hidden=frames.unpack(x), lengths=lengths)

    def layout(self, host_lengths: list[int] | None, lengths: torch.Tensor, num_frames: int) -> FrameLayout:
        """Packed when the host knows the frame counts and enough of the padded view is padding."""
        if host_lengths is not None:
            encoded = [self.output_lengths(n) for n in host_lengths]
            if min(encoded) > 0 and sum(encoded) <= (1 - self.pack_from_padding) * num_frames * len(encoded):
                return FrameLayout.packed(encoded, num_frames, lengths.device)
        return FrameLayout.padded(lengths, num_frames)
