"""The encoder and speaker head of Nemotron 3 Diarization, module names as transformers' checkpoint keys
(``model.audio_tower.*``, ``model.proj``, ``model.upsampler.conv``; the classifier sits in ``model.py``).

The encoder reads ``subsampling_factor`` stacked mel frames per encoder frame (one bias-free projection), then
pre-norm transformer layers with rotary positions over the whole step input (speaker cache, FIFO, chunk), keys
masked where a row has padding. The head projects each encoder frame, and a kernel-3 convolution whose
channels are ``subsampling_factor`` frames' worth (sub-pixel) brings the rate back to one frame per 10 ms.
"""

from __future__ import annotations

import torch
from torch import nn

from oasr.layers import Conv1d, LayerNorm, Linear, RotaryEmbedding, activation, apply_rotary, sdpa
from oasr.models.nemotron3_diarization.config import DiarizationAudioConfig, DiarizationHeadConfig


class FeatureStacking(nn.Module):
    """features [B, T, n_mels] -> [B, ceil(T / factor), hidden]: each group of ``factor`` frames, the last one
    zero-padded, concatenated and projected."""

    def __init__(self, config: DiarizationAudioConfig) -> None:
        super().__init__()
        self.factor = config.subsampling_factor
        self.projection = Linear(config.subsampling_factor * config.num_mel_bins, config.hidden_size, bias=False)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        b, t, m = features.shape
        padding = -t % self.factor
        stacked = nn.functional.pad(features, (0, 0, 0, padding)).reshape(b, (t + padding) // self.factor, m * self.factor)
        return self.projection(stacked)


class DiarizationAttention(nn.Module):
    """Bidirectional self-attention; q/k/v without bias, the output projection with one (the original's fused
    q/k/v has none). The first ``rotary_dim`` dimensions of each head rotate."""

    def __init__(self, config: DiarizationAudioConfig) -> None:
        super().__init__()
        self.num_heads, self.head_dim, self.rotary_dim = config.num_attention_heads, config.head_dim, config.rotary_dim
        width = config.num_attention_heads * config.head_dim
        self.q_proj = Linear(config.hidden_size, width, bias=False)
        self.k_proj = Linear(config.hidden_size, width, bias=False)
        self.v_proj = Linear(config.hidden_size, width, bias=False)
        self.o_proj = Linear(width, config.hidden_size, bias=True)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.num_heads, self.head_dim).transpose(1, 2)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if self.rotary_dim == self.head_dim:
            return apply_rotary(x, cos, sin)
        return torch.cat([apply_rotary(x[..., : self.rotary_dim], cos, sin), x[..., self.rotary_dim :]], dim=-1)

    def forward(self, x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor],
                mask: torch.Tensor | None) -> torch.Tensor:
        """x: [B, T, hidden]; mask: bool [B, 1, 1, T] (True: a key to attend) or None."""
        cos, sin = rotary
        q = self._rotate(self._heads(self.q_proj(x)), cos, sin)
        k = self._rotate(self._heads(self.k_proj(x)), cos, sin)
        heads = sdpa(q, k, self._heads(self.v_proj(x)), mask=mask)
        return self.o_proj(heads.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1))


class DiarizationMLP(nn.Module):
    def __init__(self, config: DiarizationAudioConfig) -> None:
        super().__init__()
        self.fc1 = Linear(config.hidden_size, config.intermediate_size)
        self.act = activation(config.hidden_act)
        self.fc2 = Linear(config.intermediate_size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2.after(self.act, self.fc1(x))


class DiarizationLayer(nn.Module):
    def __init__(self, config: DiarizationAudioConfig) -> None:
        super().__init__()
        self.layer_norm1 = LayerNorm(config.hidden_size)
        self.self_attn = DiarizationAttention(config)
        self.layer_norm2 = LayerNorm(config.hidden_size)
        self.mlp = DiarizationMLP(config)

    def forward(self, x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor],
                mask: torch.Tensor | None) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x), rotary, mask)
        return x + self.mlp(self.layer_norm2(x))


class DiarizationAudioTower(nn.Module):
    def __init__(self, config: DiarizationAudioConfig) -> None:
        super().__init__()
        self.embedder = FeatureStacking(config)
        self.input_layer_norm = LayerNorm(config.hidden_size)
        self.layers = nn.ModuleList(DiarizationLayer(config) for _ in range(config.num_hidden_layers))
        self.layer_norm = LayerNorm(config.hidden_size)
        self.rotary_emb = RotaryEmbedding(config.rotary_dim, config.rope_theta)

    def forward(self, embeds: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
        """embeds: [B, T, hidden] (stacked frames, positions 0..T-1 in every row); key_mask: bool [B, T] or None."""
        positions = torch.arange(embeds.shape[1], device=embeds.device)[None, :]
        cos, sin = self.rotary_emb(positions)
        mask = None if key_mask is None else key_mask[:, None, None, :]
        x = self.input_layer_norm(embeds)
        for layer in self.layers:
            x = layer(x, (cos, sin), mask)
        return self.layer_norm(x)


class SubpixelUpsampler(nn.Module):
    """[B, T, H] -> [B, T * factor, H]: a kernel-3 convolution to factor * H channels, read as factor frames."""

    def __init__(self, config: DiarizationHeadConfig) -> None:
        super().__init__()
        self.factor = config.subsampling_factor
        self.conv = Conv1d(config.hidden_size, config.hidden_size * config.subsampling_factor, kernel_size=3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        return self.conv(x.transpose(1, 2)).transpose(1, 2).reshape(b, t * self.factor, h)


class DiarizationBackbone(nn.Module):
    """transformers' ``Nemotron3DiarizationModel``: encoder, projection to the head's width, upsampler."""

    def __init__(self, audio: DiarizationAudioConfig, head: DiarizationHeadConfig) -> None:
        super().__init__()
        self.audio_tower = DiarizationAudioTower(audio)
        self.proj = Linear(head.audio_hidden_size, head.hidden_size)
        self.upsampler = SubpixelUpsampler(head)

    def forward(self, embeds: torch.Tensor, key_mask: torch.Tensor | None,
                present: torch.Tensor | None) -> torch.Tensor:
        """embeds: [B, T, hidden]; present: [B] frames each row really has (the rest pad a batch) or None ->
        head features [B, T * factor, head hidden]. Padding frames are zeroed before the upsampler, whose
        convolution would otherwise read them beside a row's last frame (alone, it reads its zero padding)."""
        hidden = self.proj(self.audio_tower(embeds, key_mask))
        if present is not None:
            inside = torch.arange(hidden.shape[1], device=hidden.device)[None, :] < present[:, None]
            hidden = hidden * inside[..., None].to(hidden.dtype)
        return self.upsampler(hidden)
