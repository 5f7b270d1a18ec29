"""Cache-aware streaming through the Nemotron encoder: one chunk per stream per step, the past held as state.

A chunk of ``feature_frames`` feature frames yields ``lookahead + 1`` encoder frames, equal to the whole-file
(offline) encoder's frames at the same positions, because each part of the encoder reads a bounded past:

- each strided causal convolution of the subsampling reads ``kernel - stride`` input frames from before the
  chunk (``subsampling.N``: the tail of its input at the previous chunk);
- attention reads the keys and values of the frames before the chunk (``attention.keys`` / ``.values``, the
  last ``past_frames``), of which it sees the whole chunks of left context its window allows;
- each causal depthwise convolution reads ``kernel - 1`` frames from before the chunk (``conv``, [kernel - 1,
  channels] a layer).

The first chunk is short (``first_feature_frames``); it arrives with zero frames in front so that every step
has one shape, and the frames those zeros make at each subsampling stage are zeroed again before the next stage
reads them: the offline encoder's causal padding is zeros at every stage, and a convolution's bias would
otherwise make them non-zero. A stream's state is all zeros before its first chunk.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from oasr.layers.rel_attention import relative_position_embeddings
from oasr.models.nemotron_streaming.encoder import (
    CausalConvolutionModule,
    CausalConvSubsampling,
    NemotronAsrStreamingEncoder,
)
from oasr.streaming.geometry import StateField, StreamGeometry


def stream_geometry(encoder: NemotronAsrStreamingEncoder, lookahead: int, frame_seconds: float) -> StreamGeometry:
    """The chunking of ``lookahead`` and the state one stream carries; raises ValueError where the subsampling
    cannot be streamed in whole chunks."""
    config = encoder.config
    factor = config.subsampling_factor
    if lookahead < 0:
        raise ValueError(f"lookahead must be >= 0, got {lookahead}")
    chunk = lookahead + 1
    past = config.left_context
    state = (*_subsampling_fields(encoder.subsampling, config.num_mel_bins, factor * chunk, 1 + factor * lookahead),
             StateField("attention.keys", _kv_shape(encoder, past), ring=True),
             StateField("attention.values", _kv_shape(encoder, past), ring=True),
             StateField("conv", (config.num_hidden_layers, config.conv_kernel_size - 1, config.hidden_size)))
    return StreamGeometry(lookahead=lookahead, chunk_frames=chunk, first_feature_frames=1 + factor * lookahead,
                          feature_frames=factor * chunk, past_frames=past,
                          visible_past_frames=min(past, (past // chunk) * chunk), frame_seconds=frame_seconds,
                          state=state, tail=config.stream_tail)


def _kv_shape(encoder: NemotronAsrStreamingEncoder, past: int) -> tuple[int, ...]:
    attention = encoder.layers[0].self_attn
    return (encoder.config.num_hidden_layers, attention.num_heads, past, attention.head_dim)


def _stage_convs(subsampling: CausalConvSubsampling) -> list[torch.nn.Module]:
    return [subsampling.conv_in, *(layer.depthwise_conv for layer in subsampling.layers)]


def _subsampling_fields(
    subsampling: CausalConvSubsampling, num_mel_bins: int, chunk_frames: int, first_frames: int
) -> tuple[StateField, ...]:
    """One input tail per strided convolution; checks that a chunk's outputs start on whole output frames."""
    kernel, stride = subsampling.kernel_size, subsampling.stride
    tail = kernel - stride
    fields, num_freqs, start = [], num_mel_bins, first_frames - chunk_frames  # the first chunk's zeros: start < 0
    for index, conv in enumerate(_stage_convs(subsampling)):
        fields.append(StateField(f"subsampling.{index}", (conv.in_channels, tail, num_freqs)))
        offset = start - tail + kernel - 1  # the stage's first output, times the stride, in stream frames
        if offset % stride or chunk_frames % stride:
            raise ValueError(f"a chunk of {chunk_frames} feature frames does not subsample into whole frames")
        start, chunk_frames = offset // stride, chunk_frames // stride
        num_freqs = subsampling.strided_length(num_freqs)
    if start != 0:
        raise ValueError("the first chunk's padding does not end at the first encoder frame")
    return tuple(fields)


def _leading_padding(subsampling: CausalConvSubsampling, geometry: StreamGeometry) -> list[int]:
    """The frames before the stream's start at each strided convolution's input, in the first chunk."""
    kernel, stride = subsampling.kernel_size, subsampling.stride
    padding, start = [], -geometry.first_padding_frames
    for _ in _stage_convs(subsampling):
        padding.append(-start)
        start = (start - (kernel - stride) + kernel - 1) // stride
    return padding


def _subsample(subsampling: CausalConvSubsampling, features: torch.Tensor, state: dict[str, torch.Tensor],
               first: torch.Tensor, geometry: StreamGeometry) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """features: [B, feature_frames, n_mels] -> (frames [B, chunk_frames, hidden], the new input tails)."""
    kernel, stride = subsampling.kernel_size, subsampling.stride
    freq_pads = (kernel - 1, stride - 1)
    tails = {}
    x = features.unsqueeze(1)  # [B, 1, T, F]
    stages = [(subsampling.conv_in, None), *((layer.depthwise_conv, layer.pointwise_conv) for layer in
                                             subsampling.layers)]
    for index, ((strided, pointwise), padding) in enumerate(zip(stages, _leading_padding(subsampling, geometry),
                                                                strict=True)):
        if padding:  # the first chunk's frames before the stream: zero, as the offline causal padding
            before = torch.arange(x.shape[2], device=x.device) < padding
            x = x.masked_fill(first[:, None, None, None] & before[None, None, :, None], 0.0)
        name = f"subsampling.{index}"
        x = torch.cat([state[name], x], dim=2)
        tails[name] = x[:, :, x.shape[2] - (kernel - stride):]
        x = strided(F.pad(x, freq_pads))
        if pointwise is not None:
            x = pointwise(x)
        x = subsampling.activation(x)
    b, channels, num_frames, num_freqs = x.shape
    return subsampling.linear(x.transpose(1, 2).reshape(b, num_frames, channels * num_freqs)), tails


def _convolve(conv: CausalConvolutionModule, x: torch.Tensor, tail: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [B, T, C]; tail: [B, kernel - 1, C] the depthwise input before the chunk -> (out [B, T, C], new tail).

    The depthwise convolution of a chunk's few frames is a weighted sum over each frame's window, taken here
    directly in the [B, T, C] layout: cuDNN's depthwise kernel over a short time axis and many rows is the slowest
    part of a large step, and it needs the layout transposed both ways.
    """
    y = torch.cat([tail, conv.glu(conv.pointwise_conv1(x))], dim=1)  # [B, kernel - 1 + T, C]
    new_tail = y[:, y.shape[1] - tail.shape[1]:]
    depthwise = conv.depthwise_conv
    y = (y.unfold(1, depthwise.weight.shape[2], 1) * depthwise.weight[:, 0]).sum(-1)  # [B, T, C]
    if depthwise.bias is not None:
        y = y + depthwise.bias
    return conv.pointwise_conv2(conv.activation(conv.norm(y))), new_tail


def stream_step(
    encoder: NemotronAsrStreamingEncoder, features: torch.Tensor, state: dict[str, torch.Tensor],
    first: torch.Tensor, past_valid: torch.Tensor, geometry: StreamGeometry, real: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One chunk of every row's stream.

    features: [B, feature_frames, n_mels] (the first chunk zero in front); state: each of ``geometry.state``'s
    fields, [B, *shape], the rows' state after their previous chunk (zeros before the first), but the attention
    caches, which are ``RingRows`` read and appended in place (their newest ``past_frames``); first: bool [B],
    the rows whose chunk is their first; past_valid: bool [B, past_frames], the past frames each row's queries may
    see (``StreamGeometry.visible_past``, newest last); real: bool [B, chunk_frames], the chunk's frames that hold
    audio, the only keys its attention sees (None: all; see ``StreamGeometry.tail``; the frames after them are
    not decoded, and the causal convolutions keep them out of the frames before) -> (hidden [B, chunk_frames,
    hidden_size], the new state but the attention caches).
    """
    x, new_state = _subsample(encoder.subsampling, features, state, first, geometry)
    x = x * encoder.input_scale
    past = geometry.past_frames
    positions = relative_position_embeddings(x.shape[1], x.shape[2], device=x.device, dtype=x.dtype,
                                             num_keys=past + x.shape[1])
    # Each layer's window: its past keys and values read from the rings with room for the chunk's, which
    # attention writes in place; the chunk's are then appended to the rings, over the oldest.
    chunk = x.shape[1]
    key_ring, value_ring = state["attention.keys"], state["attention.values"]
    tails, new_tails = state["conv"], []
    for index, block in enumerate(encoder.layers):
        x, h = block.norm_self_att.add_forward(x, block.feed_forward1(block.norm_feed_forward1(x)), alpha=0.5)
        keys, values = key_ring.window(index, chunk), value_ring.window(index, chunk)
        attended = block.self_attn.attend_in_window(h, positions, keys, values, past_valid, real)
        key_ring.append(index, keys[:, :, past:])
        value_ring.append(index, values[:, :, past:])
        x, h = block.norm_conv.add_forward(x, attended)
        convolved, tail = _convolve(block.conv, h, tails[:, index])
        new_tails.append(tail)
        x, h = block.norm_feed_forward2.add_forward(x, convolved)
        x = block.norm_out.add_forward(x, block.feed_forward2(h), alpha=0.5)[1]
    new_state["conv"] = torch.stack(new_tails, 1)
    return x, new_state
