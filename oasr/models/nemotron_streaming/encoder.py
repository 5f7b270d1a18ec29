"""The cache-aware FastConformer encoder of Nemotron ASR streaming, whole-file (offline) forward.

It is Parakeet's encoder (``oasr.models.fastconformer.encoder``) with three parts made causal or limited, so that
a chunk of audio can later be encoded with a bounded cache instead of the whole past:

- ``CausalConvSubsampling``: each strided convolution pads time (and frequency) by (kernel - 1) before and
  (stride - 1) after, so an output frame reads no input after its own last one. Keys as transformers':
  ``subsampling.conv_in``, ``subsampling.layers.N.{depthwise_conv,pointwise_conv}``, ``subsampling.linear``.
- ``CausalConvolutionModule``: the depthwise convolution pads (kernel - 1) frames before and none after, and a
  layer norm (``conv.norm``) stands where Parakeet has a batch norm.
- ``ChunkedLimitedWindow``: attention in chunks of (lookahead + 1) frames; a query sees every key of its own
  chunk and of the ``left_context // chunk`` chunks before it. Offline, transformers' forward uses this window
  with ``default_num_lookahead_tokens`` (and so does this encoder).

Padding: a real frame never reads a later frame in either convolution, so padding reaches a real output only
where a strided convolution's right pad of (stride - 1) frames overlaps the padded tail; each stage zeroes the
frames past every row's length, as the reference does. Attention gives padded keys no weight.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from oasr.layers import GLU, Conv1d, Conv2d, LayerNorm, Linear, PointwiseConv1d, ReLU, activation
from oasr.layers.frames import FrameLayout
from oasr.models.fastconformer.encoder import FastConformerEncoder, frame_mask
from oasr.models.nemotron_streaming.config import NemotronAsrStreamingEncoderConfig


def causal_pads(kernel: int, stride: int) -> tuple[int, int]:
    """(before, after) padding of a causal strided convolution along one axis."""
    return kernel - 1, stride - 1


def causal_strided_length(length, kernel: int, stride: int):  # int or tensor: the arithmetic is the same
    before, after = causal_pads(kernel, stride)
    return (length + before + after - kernel) // stride + 1


def zero_frames_past(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """x: [B, C, T, F] -> x with every frame t >= lengths[b] zeroed."""
    return x * frame_mask(lengths, x.shape[2])[:, None, :, None].to(x.dtype)


class CausalSubsamplingLayer(nn.Module):
    """A depthwise strided causal convolution, then a pointwise one; [B, C, T, F] -> [B, C, T', F']."""

    def __init__(self, config: NemotronAsrStreamingEncoderConfig) -> None:
        super().__init__()
        channels = config.subsampling_conv_channels
        self.depthwise_conv = Conv2d(channels, channels, config.subsampling_conv_kernel_size,
                                     stride=config.subsampling_conv_stride, groups=channels)
        self.pointwise_conv = Conv2d(channels, channels, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pointwise_conv(self.depthwise_conv(x))


class CausalConvSubsampling(nn.Module):
    """[B, T, n_mels] features -> [B, T', hidden] frames, T' = each stride's causal length of T in turn."""

    def __init__(self, config: NemotronAsrStreamingEncoderConfig) -> None:
        super().__init__()
        kernel, stride = config.subsampling_conv_kernel_size, config.subsampling_conv_stride
        channels = config.subsampling_conv_channels
        self.kernel_size, self.stride = kernel, stride
        self.conv_in = Conv2d(1, channels, kernel, stride=stride)
        self.layers = nn.ModuleList(CausalSubsamplingLayer(config) for _ in range(config.num_subsampling_layers - 1))
        self.activation = ReLU()
        num_freqs = config.num_mel_bins
        for _ in range(config.num_subsampling_layers):
            num_freqs = self.strided_length(num_freqs)
        self.linear = Linear(channels * num_freqs, config.hidden_size)

    def strided_length(self, length):  # int or tensor
        return causal_strided_length(length, self.kernel_size, self.stride)

    def causal_pad(self, x: torch.Tensor) -> torch.Tensor:
        """x: [B, C, T, F] -> padded by ``causal_pads`` along time and frequency alike."""
        before, after = causal_pads(self.kernel_size, self.stride)
        return F.pad(x, (before, after, before, after))

    def forward(self, features: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """features: [B, T, n_mels] (zero past each row's length); lengths: [B] -> (frames [B, T', hidden],
        lengths [B])."""
        lengths = self.strided_length(lengths)
        x = self.activation(zero_frames_past(self.conv_in(self.causal_pad(features.unsqueeze(1))), lengths))
        for layer in self.layers:
            lengths = self.strided_length(lengths)
            x = self.activation(zero_frames_past(layer(self.causal_pad(x)), lengths))
        b, channels, num_frames, num_freqs = x.shape
        return self.linear(x.transpose(1, 2).reshape(b, num_frames, channels * num_freqs)), lengths


class CausalConvolutionModule(nn.Module):
    """Pointwise conv + GLU, causal depthwise conv, layer norm, activation, pointwise conv; keeps the layout
    ``frames`` describes ([B, T, C] padded or [rows, C] packed)."""

    def __init__(self, config: NemotronAsrStreamingEncoderConfig) -> None:
        super().__init__()
        channels, kernel, bias = config.hidden_size, config.conv_kernel_size, config.convolution_bias
        self.left_pad = kernel - 1
        self.pointwise_conv1 = PointwiseConv1d(channels, 2 * channels, bias=bias)
        self.glu = GLU(dim=-1)
        self.depthwise_conv = Conv1d(channels, channels, kernel, groups=channels, bias=bias)
        self.norm = LayerNorm(channels)
        self.activation = activation(config.hidden_act)
        self.pointwise_conv2 = PointwiseConv1d(channels, channels, bias=bias)

    def forward(self, x: torch.Tensor, frames: FrameLayout) -> torch.Tensor:
        x = self.glu(frames.unpack(self.pointwise_conv1(x))).transpose(1, 2)  # [B, C, T]
        # Causal: a real frame reads itself and earlier ones only, so the padded tail needs no zeroing here.
        x = self.depthwise_conv(F.pad(x, (self.left_pad, 0))).transpose(1, 2)
        return self.pointwise_conv2(self.activation(self.norm(frames.pack(x))))


@dataclass(frozen=True)
class ChunkedLimitedWindow:
    """NeMo's ``chunked_limited`` attention context: frames grouped in chunks of ``right_context + 1``; a query
    attends to the keys of its chunk and of ``left_context // chunk`` chunks before it (whole chunks only)."""

    left_context: int  # frames behind a query it may see (rounded down to whole chunks)
    right_context: int  # lookahead frames: the chunk is this plus one

    @property
    def chunk_size(self) -> int:
        return self.right_context + 1

    @property
    def left_chunks(self) -> int:
        return self.left_context // self.chunk_size

    def __call__(self, num_frames: int, device: torch.device) -> torch.Tensor:
        """-> bool [T, T] by (query, key), True where attention may look."""
        chunk = torch.arange(num_frames, device=device) // self.chunk_size
        behind = chunk[:, None] - chunk[None, :]
        return (behind >= 0) & (behind <= self.left_chunks)


class NemotronAsrStreamingEncoder(FastConformerEncoder):
    """The whole-file forward of the cache-aware encoder, with the default lookahead's attention window."""

    def __init__(self, config: NemotronAsrStreamingEncoderConfig) -> None:
        window = ChunkedLimitedWindow(config.left_context, config.default_num_lookahead_tokens)
        super().__init__(config, subsampling=CausalConvSubsampling(config), conv_module=CausalConvolutionModule,
                         attention_window=window)
