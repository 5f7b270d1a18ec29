"""Qwen3-ASR's audio encoder (AuT) and projector, module for module in transformers' key layout
(``model.audio_tower.*``, ``model.multi_modal_projector.*``).

The log-mel frames are cut into chunks of ``2 * n_window`` (1 s); each chunk goes through three stride-2
convolutions (``conv2d1..3``, GELU after each) and ``conv_out`` to 13 positions, to which a sinusoid restarting in
every chunk is added. The valid positions of a request (those its audio frames reach) are packed one after another,
and pre-LN transformer layers attend within windows of ``n_window_infer`` frames' worth of positions (a request's
first window starts at its first position); ``ln_post`` closes. The projector (Linear, GELU, Linear) maps each
position to the language model's width.
"""

from __future__ import annotations

import torch
from torch import nn

from oasr.layers import GELU, Conv2d, LayerNorm, Linear, MultiHeadAttention, activation
from oasr.layers.positions import timescale_sinusoids
from oasr.models.qwen3_asr.config import Qwen3ASRConfig, Qwen3AudioEncoderConfig


def conv_lengths(frames: torch.Tensor) -> torch.Tensor:
    """Frames of a chunk [...] -> positions after the three (kernel 3, stride 2, padding 1) convolutions; an empty
    chunk stays empty."""
    for _ in range(3):
        frames = torch.where(frames > 0, (frames - 1) // 2 + 1, torch.zeros_like(frames))
    return frames


def encoder_positions(num_frames: int, chunk_frames: int) -> int:
    """The audio positions (prompt embeddings) of ``num_frames`` feature frames: whole chunks, then the rest."""
    full, rest = divmod(num_frames, chunk_frames)
    per_chunk = int(conv_lengths(torch.tensor(chunk_frames)))
    return full * per_chunk + int(conv_lengths(torch.tensor(rest)))


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
        """x: [B, S, d]; mask: bool [B, 1, S, S] (True = attend) -> [B, S, d]."""
        h = self.self_attn_layer_norm(x)
        x = x + self.self_attn.attend(h, *self.self_attn.project_kv(h), mask=mask)
        return x + self.fc2(self.act(self.fc1(self.final_layer_norm(x))))


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

    def _chunks(self, features: torch.Tensor) -> torch.Tensor:
        """features [B, n_mels, C * chunk] -> every chunk's positions [B, C * P, d] (P per chunk, sinusoid added)."""
        b, mels, frames = features.shape
        chunk = self.config.chunk_frames
        x = features.view(b, mels, frames // chunk, chunk).permute(0, 2, 1, 3).reshape(-1, 1, mels, chunk)
        for conv in (self.conv2d1, self.conv2d2, self.conv2d3):
            x = self.gelu(conv(x))
        n, channels, bins, steps = x.shape
        x = self.conv_out(x.permute(0, 3, 1, 2).reshape(n, steps, channels * bins))
        x = x + self.positional_embedding[:steps].to(x.dtype)
        return x.reshape(b, -1, x.shape[-1])

    def _pack(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's valid positions moved to its front -> (packed [B, S, d], valid positions [B] on x's device).
        The counts are computed where ``lengths`` lies: the engine passes host lengths, so reading the longest
        does not wait for the device."""
        b, total, d = x.shape
        chunk = self.config.chunk_frames
        num_chunks = total // int(conv_lengths(torch.tensor(chunk)))
        starts = torch.arange(num_chunks, device=lengths.device) * chunk
        per_chunk = conv_lengths((lengths[:, None] - starts).clamp(0, chunk))  # [B, C]
        longest = int(per_chunk.sum(dim=1).max())
        per_chunk = per_chunk.to(x.device)
        steps = total // num_chunks
        valid = (torch.arange(steps, device=x.device) < per_chunk[..., None]).reshape(b, total)
        counts = per_chunk.sum(dim=1)
        # A stable sort of "is padding" puts each row's valid positions first, in order.
        order = torch.sort((~valid).to(torch.int8), dim=1, stable=True).indices[:, :longest]
        return x.gather(1, order[..., None].expand(-1, -1, d)), counts

    def window_mask(self, counts: torch.Tensor, length: int) -> torch.Tensor:
        """Valid positions [B] -> bool [B, 1, S, S]: positions of one row attend within their window; padding
        attends to padding only (so no row of the softmax is empty)."""
        chunk = self.config.chunk_frames
        window = int(conv_lengths(torch.tensor(chunk))) * (self.config.n_window_infer // chunk)
        positions = torch.arange(length, device=counts.device)
        group = torch.where(positions < counts[:, None], positions // window, -1)
        return (group[:, :, None] == group[:, None, :])[:, None]

    def forward(self, features: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """features: [B, n_mels, frames] (frames a multiple of the chunk); lengths: [B] valid frames
        -> (hidden [B, S, d_model], valid positions [B])."""
        x, counts = self._pack(self._chunks(features), lengths)
        mask = self.window_mask(counts, x.shape[1])
        for layer in self.layers:
            x = layer(x, mask)
        return self.ln_post(x), counts


class MultiModalProjector(nn.Module):
    def __init__(self, config: Qwen3ASRConfig) -> None:
        super().__init__()
        audio = config.audio_config
        self.linear_1 = Linear(audio.d_model, audio.d_model)
        self.act = activation(audio.activation_function)
        self.linear_2 = Linear(audio.d_model, audio.output_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.act(self.linear_1(x)))
