"""Qwen3-ASR's audio encoder (AuT) and projector, module for module in transformers' key layout
(``model.audio_tower.*``, ``model.multi_modal_projector.*``).

The log-mel frames are cut into chunks of ``2 * n_window`` (1 s); each chunk holding audio goes through three
stride-2 convolutions (``conv2d1..3``, GELU after each) and ``conv_out`` to 13 positions, to which a sinusoid
restarting in every chunk is added. The valid positions of a request (those its audio frames reach) follow one
another, and pre-LN transformer layers attend within windows of ``n_window_infer`` frames' worth of positions (a
request's first window starts at its first position): each window runs as a sequence of its own
(``oasr.models.qwen3_asr.windows``); ``ln_post`` closes. The projector (Linear, GELU, Linear) maps each
position to the language model's width.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from oasr.layers import GELU, Conv2d, LayerNorm, Linear, MultiHeadAttention, activation, sdpa
from oasr.layers.positions import timescale_sinusoids
from oasr.models.qwen3_asr.config import Qwen3ASRConfig, Qwen3AudioEncoderConfig
from oasr.models.qwen3_asr.windows import WindowPlan, positions_of


def encoder_positions(num_frames: int, chunk_frames: int) -> int:
    """The audio positions (prompt embeddings) of ``num_frames`` feature frames: whole chunks, then the rest."""
    full, rest = divmod(num_frames, chunk_frames)
    return full * positions_of(chunk_frames) + positions_of(rest)


class AudioEncoderLayer(nn.Module):
    def __init__(self, config: Qwen3AudioEncoderConfig) -> None:
        super().__init__()
        d = config.d_model
        self.self_attn = MultiHeadAttention(d, config.encoder_attention_heads, k_bias=True)
        self.self_attn_layer_norm = LayerNorm(d)
        self.fc1 = Linear(d, config.encoder_ffn_dim)
        self.fc2 = Linear(config.encoder_ffn_dim, d)
        self.act = activation(config.activation_function)
        self.final_layer_norm = LayerNorm(d)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x: [B, S, d]; mask: bool [B, 1, S | 1, S] (True = attend) -> [B, S, d]."""
        h = self.self_attn_layer_norm(x)
        x = x + self.self_attn.project_out(sdpa(*self.self_attn.project_qkv(h), mask=mask))
        return x + self.fc2.after(self.act, self.fc1(self.final_layer_norm(x)))


class Qwen3AudioEncoder(nn.Module):
    def __init__(self, config: Qwen3AudioEncoderConfig) -> None:
        super().__init__()
        self.config = config
        channels = config.downsample_hidden_size
        self.conv2d1 = Conv2d(1, channels, 3, 2, padding=1)
        self.conv2d2 = Conv2d(channels, channels, 3, 2, padding=1)
        self.conv2d3 = Conv2d(channels, channels, 3, 2, padding=1)
        self.gelu = GELU()
        self.conv_out = Linear(channels * config.conv_frequencies, config.d_model, bias=False)
        # Not a checkpoint key (transformers keeps it as a non-persistent buffer).
        self.register_buffer("positional_embedding",
                             timescale_sinusoids(config.max_position_embeddings, config.d_model), persistent=False)
        self.layers = nn.ModuleList(AudioEncoderLayer(config) for _ in range(config.encoder_layers))
        self.ln_post = LayerNorm(config.d_model)

    def _chunk_positions(self, features: torch.Tensor, plan: WindowPlan) -> torch.Tensor:
        """features [B, n_mels, C * chunk] -> the positions of the chunks holding audio, [N * P, d] (P per chunk,
        the sinusoid that restarts in every chunk added)."""
        b, mels, frames = features.shape
        chunk = self.config.chunk_frames
        x = features.view(b, mels, frames // chunk, chunk).permute(0, 2, 1, 3).reshape(-1, 1, mels, chunk)
        x = self.gelu(one_channel_conv(self.conv2d1, x[plan.chunks]))
        for conv in (self.conv2d2, self.conv2d3):  # channels last in and out: cuDNN's layout, no conversions
            x = self.gelu(conv(x))
        n, channels, bins, steps = x.shape
        # Rows of (chunk, step) made dense first: a strided [n, steps, channels * bins] view would make the
        # projection a batched matmul over n copies of its weight, many times slower than this one GEMM.
        x = self.conv_out(x.permute(0, 3, 1, 2).reshape(n * steps, channels * bins)).view(n, steps, -1)
        return (x + self.positional_embedding[:steps].to(x.dtype)).reshape(n * steps, -1)

    def plan(self, features: torch.Tensor, lengths: torch.Tensor) -> WindowPlan:
        """The batch's window layout from its valid frames ``lengths`` [B] (host ints: no device wait)."""
        chunk = self.config.chunk_frames
        return WindowPlan.build([int(n) for n in lengths.tolist()], features.shape[-1] // chunk, chunk,
                                self.config.n_window_infer // chunk, features.device)

    def forward(self, features: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """features: [B, n_mels, frames] (frames a multiple of the chunk); lengths: [B] valid frames
        -> (hidden [B, S, d_model], each row's positions packed from its front; valid positions [B], on the
        features' device)."""
        plan = self.plan(features, lengths)
        x = self._chunk_positions(features, plan)
        x = with_zero_row(x)[plan.into_windows].view(plan.num_windows, plan.window, -1)
        for layer in self.layers:
            x = layer(x, plan.keys)
        x = with_zero_row(x.reshape(-1, x.shape[-1]))[plan.out_of_windows]
        return self.ln_post(x), plan.lengths


def one_channel_conv(conv: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """``conv`` (one input channel) of x [N, 1, H, W] as one matrix multiply of its taps, bias included
    -> [N, C, H', W'] in channels-last memory. (cuDNN runs a one-channel convolution on a slow generic kernel and
    then converts its output, the largest activation of the encoder, to channels last for the next one.)"""
    if (conv.in_channels != 1 or conv.groups != 1 or conv.dilation != (1, 1) or conv.padding_mode != "zeros"
            or isinstance(conv.padding, str)):
        raise ValueError("one_channel_conv takes a plain convolution of one input channel")
    n, _, h, w = x.shape
    (kh, kw), (sh, sw), (ph, pw) = conv.kernel_size, conv.stride, conv.padding
    rows, cols = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
    taps = F.unfold(x, conv.kernel_size, padding=conv.padding, stride=conv.stride)  # [N, kh * kw, rows * cols]
    weight = conv.weight.view(conv.out_channels, kh * kw).t()
    flat = taps.transpose(1, 2).reshape(-1, kh * kw)
    out = flat @ weight if conv.bias is None else torch.addmm(conv.bias, flat, weight)
    return out.view(n, rows, cols, conv.out_channels).permute(0, 3, 1, 2)


def with_zero_row(x: torch.Tensor) -> torch.Tensor:
    """[N, d] -> [N + 1, d], a zero row last (what padding slots gather)."""
    return torch.cat((x, x.new_zeros(1, x.shape[-1])))


class MultiModalProjector(nn.Module):
    def __init__(self, config: Qwen3ASRConfig) -> None:
        super().__init__()
        audio = config.audio_config
        self.linear_1 = Linear(audio.d_model, audio.d_model)
        self.act = activation(audio.activation_function)
        self.linear_2 = Linear(audio.d_model, audio.output_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.act(self.linear_1(x)))
