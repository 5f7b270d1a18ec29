"""FunASR's ``TransformerDecoder``, run teacher-forced to score whole hypotheses (attention rescoring).

The decoder reads ``<s>`` then a hypothesis's tokens and gives, at each position, log-probabilities of the next
token; a hypothesis's score is the sum of the log-probabilities of its tokens and of the ``</s>`` after them. That
is the sum FunASR's beam search accumulates for the decoder scorer (``TransformerDecoder.score``, a token at a
time) and WeNet's ``attention_rescoring`` computes in one pass; OASR computes it in one pass over all the
hypotheses of a batch, padded to the longest. Module names mirror FunASR's keys (``decoder.embed.0``,
``decoders.N.self_attn.linear_q``, ``src_attn``, ``feed_forward.w_1``, ``norm1``..``norm3``, ``after_norm``,
``output_layer``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from oasr.layers import Embedding, LayerNorm, Linear, ReLU
from oasr.models.funasr_conformer.config import TransformerDecoderConfig
from oasr.models.funasr_conformer.encoder import NORM_EPS, FeedForward, sinusoids


class Attention(nn.Module):
    """``MultiHeadedAttention``: scaled dot-product attention over masked keys."""

    def __init__(self, size: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads, self.head_dim = num_heads, size // num_heads
        self.linear_q = Linear(size, size)
        self.linear_k = Linear(size, size)
        self.linear_v = Linear(size, size)
        self.linear_out = Linear(size, size)

    def heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(x.shape[0], x.shape[1], self.num_heads, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor, memory: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x: [N, L, D] queries; memory: [N, S, D] keys and values; mask: bool [N, 1, L or 1, S] (True: attend)."""
        q, k, v = self.heads(self.linear_q(x)), self.heads(self.linear_k(memory)), self.heads(self.linear_v(memory))
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        out = torch.matmul(torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1), v)
        return self.linear_out(out.transpose(1, 2).reshape(x.shape))


class DecoderLayer(nn.Module):
    """Pre-norm: causal self-attention, cross-attention over the encoder frames, ReLU feed-forward."""

    def __init__(self, size: int, c: TransformerDecoderConfig) -> None:
        super().__init__()
        self.self_attn = Attention(size, c.attention_heads)
        self.src_attn = Attention(size, c.attention_heads)
        self.feed_forward = FeedForward(size, c.linear_units, ReLU())
        self.norm1 = LayerNorm(size, eps=NORM_EPS)
        self.norm2 = LayerNorm(size, eps=NORM_EPS)
        self.norm3 = LayerNorm(size, eps=NORM_EPS)

    def forward(self, x: torch.Tensor, self_mask: torch.Tensor, memory: torch.Tensor,
                memory_mask: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.self_attn(h, h, self_mask)
        x = x + self.src_attn(self.norm2(x), memory, memory_mask)
        return x + self.feed_forward(self.norm3(x))


class TransformerDecoder(nn.Module):
    def __init__(self, c: TransformerDecoderConfig, size: int, vocab_size: int) -> None:
        super().__init__()
        self.size = size
        self.embed = nn.Sequential(Embedding(vocab_size, size))
        self.decoders = nn.ModuleList(DecoderLayer(size, c) for _ in range(c.num_blocks))
        self.after_norm = LayerNorm(size, eps=NORM_EPS)
        self.output_layer = Linear(size, vocab_size)

    def forward(self, tokens: torch.Tensor, token_lengths: torch.Tensor, memory: torch.Tensor,
                memory_lengths: torch.Tensor) -> torch.Tensor:
        """tokens: int64 [N, L] (``<s>`` first), token_lengths: [N]; memory: [N, S, D], memory_lengths: [N] ->
        log-probabilities of each next token [N, L, vocab] (float32)."""
        n, length = tokens.shape
        steps = torch.arange(length, device=tokens.device)
        x = self.embed(tokens) * math.sqrt(self.size) + sinusoids(steps.float(), self.size).to(memory.dtype)
        valid = steps[None, :] < token_lengths[:, None]
        self_mask = (valid[:, None, :] & (steps[None, :] <= steps[:, None])[None])[:, None]  # [N, 1, L, L]
        memory_mask = (torch.arange(memory.shape[1], device=memory.device)[None, :]
                       < memory_lengths[:, None])[:, None, None, :]
        for layer in self.decoders:
            x = layer(x, self_mask, memory, memory_mask)
        return F.log_softmax(self.output_layer(self.after_norm(x)).float(), dim=-1)

    def score(self, memory: torch.Tensor, memory_lengths: torch.Tensor, hypotheses: Sequence[Sequence[int]],
              sos: int, eos: int) -> torch.Tensor:
        """Each hypothesis's log-probability, ``</s>`` included. memory: [N, S, D] (row i: the encoder frames of
        hypothesis i), memory_lengths: [N]; hypotheses: N token-id lists without ``<s>``/``</s>`` -> [N] float32."""
        n = len(hypotheses)
        longest = max((len(h) for h in hypotheses), default=0) + 1
        inputs = torch.full((n, longest), eos, dtype=torch.long)
        targets = torch.full((n, longest), eos, dtype=torch.long)
        for i, hypothesis in enumerate(hypotheses):
            inputs[i, : len(hypothesis) + 1] = torch.tensor([sos, *hypothesis], dtype=torch.long)
            targets[i, : len(hypothesis)] = torch.tensor(list(hypothesis), dtype=torch.long)
        lengths = torch.tensor([len(h) + 1 for h in hypotheses])
        device = memory.device
        inputs, targets, lengths = inputs.to(device), targets.to(device), lengths.to(device)
        log_probs = self(inputs, lengths, memory, memory_lengths).gather(2, targets[..., None])[..., 0]
        counted = torch.arange(longest, device=device)[None, :] < lengths[:, None]
        return log_probs.masked_fill(~counted, 0.0).sum(dim=1)
