"""Multi-head attention over ``torch.nn.functional.scaled_dot_product_attention``.

Projections are named ``q_proj``/``k_proj``/``v_proj``/``out_proj`` (the Hugging Face layout most speech
checkpoints use). Key/value can be computed from an input or passed in precomputed (cross-attention K/V made
once per request, or a decoder's self-attention cache), so the same module serves encoders and decoders.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, ClassVar

import torch
from torch import nn

from oasr.layers.basic import Linear
from oasr.layers.sdpa import sdpa  # noqa: F401 (oasr.layers.attention's name too)
from oasr.layers.shared_input import SharedInput

if TYPE_CHECKING:
    from oasr.layers.cache import CrossAttentionCache, SelfAttentionCache

# Where a projection goes: a buffer written in place ([B, T, E]), or a callable handed the rows [B * T, E].
KVOut = torch.Tensor | Callable[[torch.Tensor], None]


class MultiHeadAttention(nn.Module):
    KERNEL_OP: ClassVar[str] = "attention"

    def __init__(self, embed_dim: int, num_heads: int, *, k_bias: bool = False) -> None:
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim {embed_dim} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.q_proj = Linear(embed_dim, embed_dim)
        self.k_proj = Linear(embed_dim, embed_dim, bias=k_bias)
        self.v_proj = Linear(embed_dim, embed_dim)
        self.out_proj = Linear(embed_dim, embed_dim)

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """[B, T, H*D] -> [B, H, T, D]."""
        b, t, _ = x.shape
        return x.view(b, t, self.num_heads, self.head_dim).transpose(1, 2)

    def project_kv(self, x: torch.Tensor | SharedInput) -> tuple[torch.Tensor, torch.Tensor]:
        """x: [B, T, E] (or a ``SharedInput`` of it) -> (k, v), each [B, H, T, D]."""
        shared = x if isinstance(x, SharedInput) else SharedInput(x)
        return self.split_heads(shared(self.k_proj)), self.split_heads(shared(self.v_proj))

    def project_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x: [B, T, E] -> (q, k, v), each [B, H, T, D]; quantized projections share one quantization of x."""
        shared = SharedInput(x)
        return (self.split_heads(shared(self.q_proj)), *self.project_kv(shared))

    def project_kv_into(self, x: torch.Tensor | SharedInput, k_out: KVOut, v_out: KVOut) -> None:
        """Like ``project_kv``, written straight into ``k_out`` and ``v_out`` (contiguous [B, T, E], x's dtype):
        a caller that keeps K/V in its own buffers (the engine's cross-attention slots) needs no copy after. Either
        may instead be a callable, handed the projection ([B * T, E]) to store its own way (an e4m3 cache)."""
        shared = x if isinstance(x, SharedInput) else SharedInput(x)
        rows = shared.rows
        for proj, out in ((self.k_proj, k_out), (self.v_proj, v_out)):
            if proj.quant_gemm is not None:  # through the shared quantization; a quantized GEMM has no out= form
                projected = shared(proj).view(rows.shape[0], -1)
                if isinstance(out, torch.Tensor):
                    out.view(-1, out.shape[-1]).copy_(projected)
                else:
                    out(projected)
            elif not isinstance(out, torch.Tensor):
                out(proj(rows))
            elif proj.bias is None:
                torch.mm(rows, proj.weight.t(), out=out.view(-1, out.shape[-1]))
            else:
                torch.addmm(proj.bias, rows, proj.weight.t(), out=out.view(-1, out.shape[-1]))

    def project_q(self, x: torch.Tensor) -> torch.Tensor:
        """x: [B, T, E] -> queries [B, H, T, D]."""
        return self.split_heads(self.q_proj(x))

    def project_out(self, heads: torch.Tensor) -> torch.Tensor:
        """Attention output [B, H, T, D] -> [B, T, E] through ``out_proj``."""
        b, _, t, _ = heads.shape
        return self.out_proj(heads.transpose(1, 2).reshape(b, t, -1))

    def head_scores(self, x: torch.Tensor, k: torch.Tensor, heads: torch.Tensor) -> torch.Tensor:
        """Pre-softmax attention logits of a few heads, which SDPA never returns (word alignment reads them).
        x: [B, Tq, E] queries; k: [B, H, Tk, D]; heads: long [h] -> float32 [B, h, Tq, Tk]."""
        q = self.project_q(x).index_select(1, heads)
        # Both sides scaled by D^-1/4, as openai-whisper does, so fp16 products stay in range.
        scale = self.head_dim**-0.25
        return ((q * scale) @ (k.index_select(1, heads) * scale).transpose(-1, -2)).float()

    def forward(self, x: torch.Tensor, *, is_causal: bool = False) -> torch.Tensor:
        """Self-attention without a cache. x: [B, T, E] -> [B, T, E]."""
        return self.project_out(sdpa(*self.project_qkv(x), is_causal=is_causal))


class CachedSelfAttention(MultiHeadAttention):
    """A decoder's self-attention over a ``SelfAttentionCache`` (same parameters as ``MultiHeadAttention``). Under
    the ``kernels`` backend the cache may attend with its own kernel (the engine's pool: one Triton pass over the
    blocks for a decode step, ``oasr.kernels.paged_attention``)."""

    KERNEL_OP: ClassVar[str] = "paged_attention"
    use_kernel = False  # set by oasr.layers.apply_backend

    def forward_cached(self, x: torch.Tensor, cache: SelfAttentionCache, layer: int) -> torch.Tensor:
        """x: [B, T, E] new tokens; ``layer``: which of the cache's layers -> [B, T, E]."""
        return self.project_out(cache.attend(layer, *self.project_qkv(x), use_kernel=self.use_kernel))


class CrossAttention(MultiHeadAttention):
    """A decoder's attention to the encoder through a ``CrossAttentionCache`` (same parameters as
    ``MultiHeadAttention``): the keys and values were projected once per request (``project_kv_into``); each step
    projects its queries and the cache attends them."""

    KERNEL_OP: ClassVar[str] = "paged_cross_attention"
    use_kernel = False  # set by oasr.layers.apply_backend

    def forward_cross(self, x: torch.Tensor, cross: CrossAttentionCache, layer: int) -> torch.Tensor:
        """x: [B, T, E] decoder states; ``layer``: which of the cache's layers -> [B, T, E]."""
        return self.project_out(cross.attend(layer, self.project_q(x), use_kernel=self.use_kernel))


def cross_kv(attentions: Sequence[CrossAttention], hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The K/V of every decoder layer's cross-attention over ``hidden`` [B, S, E], computed once per request:
    each [layers, B, H, S, D]."""
    shared = SharedInput(hidden)
    pairs = [attention.project_kv(shared) for attention in attentions]
    return torch.stack([k for k, _ in pairs]), torch.stack([v for _, v in pairs])


def cross_kv_into(attentions: Sequence[CrossAttention], hidden: torch.Tensor, k_out: torch.Tensor | Sequence[KVOut],
                  v_out: torch.Tensor | Sequence[KVOut]) -> None:
    """``cross_kv`` written into caller buffers ``k_out``/``v_out``, each [layers, B, S, E] with every layer slice
    contiguous (the engine's cross-attention stores), or a sequence of one ``KVOut`` per layer. Inference only:
    writing through ``out=`` records no gradient."""
    shared = SharedInput(hidden)  # quantized projections share one quantization of the encoder's output
    for index, attention in enumerate(attentions):
        attention.project_kv_into(shared, k_out[index], v_out[index])
