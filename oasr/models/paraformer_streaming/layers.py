"""The online Paraformer's layers over a step of B streams: the offline modules' weights, FunASR's chunked
arithmetic (``forward_chunk``), each row computing what it would alone.

Caches are right-aligned (a row's real keys are the last ``lengths[b]`` of the cached columns); ``key_mask``
hides the columns before them, and is None when every row's cache is full, so a batch of one computes exactly
FunASR's unmasked attention.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from oasr.models.paraformer.decoder import CrossAttention, DecoderLayer
from oasr.models.paraformer.sanm import SANMAttention, SANMEncoderLayer


def split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """[B, T, H * dk] -> [B, H, T, dk]."""
    b, t, size = x.shape
    return x.reshape(b, t, heads, size // heads).transpose(1, 2)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Attention as FunASR computes it (queries scaled first): [B, H, T, dk], keys [B, H, S, dk], mask bool [B, S]
    (True: a real key) or None -> [B, T, H * dk]."""
    scores = torch.matmul(q * q.shape[-1] ** -0.5, k.transpose(-2, -1))
    if mask is not None:
        scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
    out = torch.matmul(torch.softmax(scores, dim=-1), v)
    return out.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)


def key_mask(lengths: np.ndarray, cached: int, num_new: int, device: torch.device) -> torch.Tensor | None:
    """Which of ``cached`` right-aligned cache columns plus ``num_new`` step columns each row may attend to:
    bool [B, cached + num_new], or None when every row's cache is whole."""
    if (lengths >= cached).all():
        return None
    real = torch.arange(cached, device=device)[None, :] >= torch.tensor(cached - lengths, device=device)[:, None]
    return torch.cat([real, real.new_ones(len(lengths), num_new)], dim=1)


def depthwise(conv: nn.Conv1d, x: torch.Tensor, *, unfolded: bool | None = None) -> torch.Tensor:
    """An FSMN's depthwise convolution (no padding, no bias): x [B, D, S] -> [B, D, S - kernel + 1].

    Off the CPU (``unfolded`` None) it is computed as windows times taps, summed in float32, not by cuDNN: cuDNN
    9.10 and later compile a depthwise plan at run time for each new input shape (hundreds of milliseconds), and
    a step's shapes change with its number of streams and of tokens fired. On the CPU it is the module's own
    convolution, FunASR's arithmetic."""
    if not (x.device.type != "cpu" if unfolded is None else unfolded):
        return conv(x)
    taps = conv.weight[:, 0].float()  # [D, kernel]
    windows = x.float().unfold(2, taps.shape[1], 1)  # [B, D, S - kernel + 1, kernel]
    return (windows * taps[:, None, :]).sum(dim=-1).to(x.dtype)


def cif_weights(predictor, hidden: torch.Tensor, *, unfolded: bool | None = None) -> torch.Tensor:
    """The CIF predictor's weights over whole rows (``CifPredictor.weights`` with every frame real): hidden
    [B, T, D] -> alphas [B, T] float32. Off the CPU (``unfolded`` None) its convolution is windows times the
    kernel as one matrix product, for the reason ``depthwise`` gives."""
    c = predictor.config
    if not (hidden.device.type != "cpu" if unfolded is None else unfolded):
        return predictor.weights(hidden, torch.full((hidden.shape[0],), hidden.shape[1], device=hidden.device))
    conv = predictor.cif_conv1d
    context = F.pad(hidden.transpose(1, 2), (c.l_order, c.r_order))  # [B, D, T + l + r]
    windows = context.unfold(2, conv.weight.shape[2], 1).transpose(1, 2)  # [B, T, D, kernel]
    flat = windows.reshape(*windows.shape[:2], -1)
    output = torch.relu(flat @ conv.weight.reshape(conv.weight.shape[0], -1).T + conv.bias)
    alphas = torch.sigmoid(predictor.cif_output(output).float()).squeeze(-1)
    return torch.relu(alphas * c.smooth_factor - c.noise_threshold)


def sinusoid_rows(first: np.ndarray, num_frames: int, depth: int, device: torch.device, dtype: torch.dtype
                  ) -> torch.Tensor:
    """FunASR's ``SinusoidalPositionEncoder`` for each row from its own position ``first[b]``: [B, K, depth]
    (``oasr.models.paraformer.sanm.sinusoid``'s arithmetic, in float32)."""
    positions = (torch.tensor(first, device=device)[:, None] + torch.arange(num_frames, device=device)).float()
    increment = torch.log(torch.tensor([10000.0], device=device)) / (depth / 2 - 1)
    timescales = torch.exp(torch.arange(depth / 2, device=device).float() * -increment)
    scaled = positions[:, :, None] * timescales
    return torch.cat([torch.sin(scaled), torch.cos(scaled)], dim=2).to(dtype)


def encoder_layer_chunk(layer: SANMEncoderLayer, x: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor] | None,
                        mask: torch.Tensor | None, keep: int, width: int
                        ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """x: [B, T, D]; kv: the cached keys and values [B, H, C, dk] -> (x, the cache after the step: its last
    ``width`` columns with the step's first ``keep`` keys added)."""
    attn: SANMAttention = layer.self_attn
    q, k, v = attn.linear_q_k_v(layer.norm1(x)).chunk(3, dim=-1)
    # The FSMN memory over the step's frames alone: SANMAttention.fsmn with every frame real.
    memory = depthwise(attn.fsmn_block, F.pad(v.transpose(1, 2), attn.padding)).transpose(1, 2) + v
    q, k_h, v_h = (split_heads(t, attn.heads) for t in (q, k, v))
    stride = (k_h[:, :, :keep], v_h[:, :, :keep])
    if kv is not None:
        k_h, v_h = torch.cat([kv[0], k_h], dim=2), torch.cat([kv[1], v_h], dim=2)
        stride = (torch.cat([kv[0], stride[0]], dim=2), torch.cat([kv[1], stride[1]], dim=2))
    stride = (stride[0][:, :, -width:], stride[1][:, :, -width:])
    attended = attn.linear_out(attend(q, k_h, v_h, mask)) + memory
    x = x + attended if layer.residual else attended
    return x + layer.feed_forward(layer.norm2(x)), stride


def integrate_rows(frames: torch.Tensor, alphas: torch.Tensor, threshold: float
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """FunASR's frame-by-frame CIF loop, every row at once, each in FunASR's order of additions (float32):
    frames [B, T, D], alphas [B, T] -> (fires bool [B, T]: a token fired at frame t; the embedding it fired with
    [B, T, D], garbage where none did; the integrate left over [B]; the frames in it [B, D])."""
    integrate = alphas.new_zeros(alphas.shape[0])
    kept = frames.new_zeros(frames.shape[0], frames.shape[2])
    fires, fired = [], []
    for t in range(alphas.shape[1]):
        alpha, frame = alphas[:, t], frames[:, t]
        fire = alpha + integrate >= threshold
        fired.append(kept + (threshold - integrate)[:, None] * frame)
        summed = integrate + alpha
        integrate = torch.where(fire, summed - threshold, summed)
        kept = torch.where(fire[:, None], integrate[:, None] * frame, kept + alpha[:, None] * frame)
        fires.append(fire)
    return torch.stack(fires, dim=1), torch.stack(fired, dim=1), integrate, kept


def fsmn_chunk(memory, inputs: torch.Tensor, tokens: torch.Tensor, counts: torch.Tensor, started: torch.Tensor,
               state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A decoder FSMN memory over a step's tokens: inputs [F, L, D]; tokens float [F, L, 1] (1 on real tokens);
    counts [F]; started bool [F]; state [F, D, kernel - 1] the last columns of the row's previous sequence
    (zeros when not started) -> (memory [F, L, D], the new state).

    FunASR pads a first step's tokens on both sides and continues a later step's sequence from its cached
    columns: token i reads columns [i, i + kernel) of ``left zeros + tokens + right zeros`` first, of ``cache +
    tokens`` later. Both are windows of ``state + tokens + right zeros``, a first step's shifted right by
    ``right``, so one convolution serves every row."""
    right = memory.padding[1]
    rows, length, depth = inputs.shape
    seq = torch.cat([state, (inputs * tokens).transpose(1, 2), inputs.new_zeros(rows, depth, right)], dim=2)
    out = depthwise(memory.fsmn_block, seq)  # [F, D, L + right]
    offset = torch.where(started, 0, right)
    at = offset[:, None] + torch.arange(length, device=inputs.device)
    picked = out.gather(2, at[:, None, :].expand(rows, depth, length))
    tail = (offset + counts)[:, None] + torch.arange(state.shape[2], device=inputs.device)
    return picked.transpose(1, 2), seq.gather(2, tail[:, None, :].expand(rows, depth, state.shape[2]))


def decoder_layer_chunk(layer: DecoderLayer, x: torch.Tensor, tokens: torch.Tensor, counts: torch.Tensor,
                        started: torch.Tensor, state: torch.Tensor, hidden: torch.Tensor,
                        kv: tuple[torch.Tensor, torch.Tensor] | None, mask: torch.Tensor | None, width: int):
    """One decoder layer over a step's tokens (x [F, L, D]; hidden [F, T, D] the step's encoder frames) -> (x, its
    FSMN state, its cross-attention keys and values: the last ``width`` frames, None for a layer without)."""
    residual = x
    x = layer.feed_forward(layer.norm1(x))
    inputs = layer.norm2(x)
    remembered, state = fsmn_chunk(layer.self_attn, inputs, tokens, counts, started, state)
    x = residual + (remembered + inputs)
    if layer.src_attn is None:
        return x, state, None
    cross: CrossAttention = layer.src_attn
    q = split_heads(cross.linear_q(layer.norm3(x)), cross.heads)
    k, v = (split_heads(t, cross.heads) for t in cross.linear_k_v(hidden).chunk(2, dim=-1))
    if kv is not None:
        k, v = torch.cat([kv[0], k], dim=2), torch.cat([kv[1], v], dim=2)
    x = x + cross.linear_out(attend(q, k, v, mask))
    return x, state, (k[:, :, -width:], v[:, :, -width:])

