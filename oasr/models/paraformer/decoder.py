"""FunASR's ``ParaformerSANMDecoder``: one non-autoregressive pass over the CIF embeddings.

Every position is decoded at once: each layer runs a feed-forward block, an FSMN memory over the positions (no
attention between them) and cross-attention to the encoder frames. ``decoders`` holds the layers with
cross-attention, ``decoders2`` those without, ``decoders3`` a last feed-forward block whose output replaces its
input (no residual, as in FunASR). Names mirror the checkpoint; ``embed`` is held only because checkpoints carry
it (the decoder reads acoustic embeddings, not tokens).

SeACo-Paraformer (``oasr.models.seaco_paraformer``) reuses the class twice: its main decoder's ``hidden`` (the
normed output before the vocabulary layer) feeds the hotword path, and its "seaco" decoder is one built without
``embed`` and ``output_layer`` (FunASR's ``wo_input_layer`` and ``use_output_layer: false``) whose memory is the
hotwords' embeddings instead of encoder frames.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from oasr.layers import Conv1d, Embedding, LayerNorm, Linear
from oasr.models.paraformer.config import ParaformerDecoderConfig
from oasr.models.paraformer.sanm import NORM_EPS, frame_mask


class DecoderFeedForward(nn.Module):
    """``PositionwiseFeedForwardDecoderSANM``: w_2(norm(relu(w_1(x)))), w_2 without bias."""

    def __init__(self, size: int, units: int) -> None:
        super().__init__()
        self.w_1 = Linear(size, units)
        self.norm = LayerNorm(units, eps=NORM_EPS)
        self.w_2 = Linear(units, size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_2(self.norm(F.relu(self.w_1(x))))


class FsmnMemory(nn.Module):
    """``MultiHeadedAttentionSANMDecoder``: the FSMN memory alone (a depthwise convolution plus its input)."""

    def __init__(self, size: int, kernel_size: int, shift: int) -> None:
        super().__init__()
        self.fsmn_block = Conv1d(size, size, kernel_size, groups=size, bias=False)
        left = (kernel_size - 1) // 2 + max(shift, 0)
        self.padding = (left, kernel_size - 1 - left)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x: [B, L, D]; mask: float [B, L, 1] -> [B, L, D]."""
        x = x * mask
        memory = self.fsmn_block(F.pad(x.transpose(1, 2), self.padding)).transpose(1, 2)
        return (memory + x) * mask


class CrossAttention(nn.Module):
    """``MultiHeadedAttentionCrossAtt``: queries from the positions, keys and values from the encoder frames."""

    def __init__(self, heads: int, size: int, memory_size: int) -> None:
        super().__init__()
        self.heads = heads
        self.linear_q = Linear(size, size)
        self.linear_k_v = Linear(memory_size, 2 * size)
        self.linear_out = Linear(size, size)

    def forward(self, x: torch.Tensor, memory: torch.Tensor, memory_mask: torch.Tensor) -> torch.Tensor:
        """x: [B, L, D]; memory: [B, T, M]; memory_mask: bool [B, T] -> [B, L, D]."""
        b, length, size = x.shape
        head = size // self.heads
        q = self.linear_q(x).reshape(b, length, self.heads, head).transpose(1, 2)
        k, v = (t.reshape(b, -1, self.heads, head).transpose(1, 2) for t in self.linear_k_v(memory).chunk(2, dim=-1))
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=memory_mask[:, None, None, :])
        return self.linear_out(attended.transpose(1, 2).reshape(b, length, size))


class DecoderLayer(nn.Module):
    """``DecoderLayerSANM`` (pre-norm); ``memory`` and ``cross`` say which of its blocks the layer has."""

    def __init__(self, size: int, units: int, heads: int, kernel_size: int, shift: int, *, memory: bool,
                 cross: bool) -> None:
        super().__init__()
        self.feed_forward = DecoderFeedForward(size, units)
        self.norm1 = LayerNorm(size, eps=NORM_EPS)
        self.self_attn = FsmnMemory(size, kernel_size, shift) if memory else None
        self.norm2 = LayerNorm(size, eps=NORM_EPS) if memory else None
        self.src_attn = CrossAttention(heads, size, size) if cross else None
        self.norm3 = LayerNorm(size, eps=NORM_EPS) if cross else None

    def forward(self, x: torch.Tensor, mask: torch.Tensor, encoded: torch.Tensor, encoded_mask: torch.Tensor
                ) -> torch.Tensor:
        residual = x
        x = self.feed_forward(self.norm1(x))
        if self.self_attn is not None:
            x = residual + self.self_attn(self.norm2(x), mask)
        if self.src_attn is not None:
            x = x + self.src_attn(self.norm3(x), encoded, encoded_mask)
        return x


class ParaformerDecoder(nn.Module):
    def __init__(self, config: ParaformerDecoderConfig, size: int, vocab_size: int, *, embed: bool = True,
                 output_layer: bool = True) -> None:
        super().__init__()
        c = config

        def layers(count: int, *, cross: bool, shift: int, memory: bool = True) -> nn.ModuleList:
            return nn.ModuleList(DecoderLayer(size, c.linear_units, c.attention_heads, c.kernel_size, shift,
                                              memory=memory, cross=cross) for _ in range(count))

        self.embed = nn.Sequential(Embedding(vocab_size, size)) if embed else None
        self.decoders = layers(c.att_layer_num, cross=True, shift=c.sanm_shfit)
        # FunASR builds the layers without cross-attention with no FSMN shift, whatever the config says.
        self.decoders2 = layers(c.num_blocks - c.att_layer_num, cross=False, shift=0) \
            if c.num_blocks > c.att_layer_num else None
        self.decoders3 = layers(1, cross=False, shift=0, memory=False)
        self.after_norm = LayerNorm(size, eps=NORM_EPS)
        self.output_layer = Linear(size, vocab_size) if output_layer else None

    def forward(self, embeds: torch.Tensor, token_counts: torch.Tensor, encoded: torch.Tensor,
                encoded_lengths: torch.Tensor) -> torch.Tensor:
        """embeds: [B, L, D] CIF embeddings; token_counts: [B]; encoded: [B, T, D]; encoded_lengths: [B]
        -> logits [B, L, vocab]."""
        return self.output_layer(self.hidden(embeds, token_counts, encoded, encoded_lengths))

    def hidden(self, embeds: torch.Tensor, token_counts: torch.Tensor, encoded: torch.Tensor,
               encoded_lengths: torch.Tensor) -> torch.Tensor:
        """``forward``'s arguments -> the normed last layer's output [B, L, D], before the vocabulary layer."""
        mask = frame_mask(token_counts, embeds.shape[1])[:, :, None].to(embeds.dtype)
        encoded_mask = frame_mask(encoded_lengths, encoded.shape[1])
        x = embeds
        for layer in (*self.decoders, *(self.decoders2 or ()), *self.decoders3):
            x = layer(x, mask, encoded, encoded_mask)
        return self.after_norm(x)
