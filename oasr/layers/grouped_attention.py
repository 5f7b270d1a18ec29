"""Causal self-attention of Llama / Qwen decoders: grouped key/value heads, optional per-head q/k RMSNorm, rotary
positions, through a ``SelfAttentionCache``.

Projections are named ``q_proj``/``k_proj``/``v_proj``/``o_proj`` (those checkpoints' layout). ``num_kv_heads`` may
divide ``num_heads``: each key/value head then serves ``num_heads / num_kv_heads`` query heads, and caches hold
the key/value heads only (the engine's pool is sized by ``DecoderSpec.num_kv_heads``); ``sdpa`` expands them.
Qwen3 normalises every query and key head (``q_norm``/``k_norm``, RMSNorm over ``head_dim``) before the rotation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import torch
from torch import nn

from oasr.kernels import rms_norm
from oasr.layers.basic import Linear
from oasr.layers.norms import RMSNorm
from oasr.layers.rotary import apply_rotary
from oasr.layers.shared_input import SharedInput

if TYPE_CHECKING:
    from oasr.layers.cache import SelfAttentionCache


class GroupedQueryAttention(nn.Module):
    """x [B, T, hidden] -> [B, T, hidden]. ``qk_norm_eps`` None: no per-head norms (Llama); a float: Qwen3's."""

    # Under the kernels backend a decode step over the engine's pool runs oasr.kernels.paged_attention, which
    # reads each key/value head for the query heads it serves.
    KERNEL_OP: ClassVar[str] = "paged_attention"
    use_kernel = False  # set by oasr.layers.apply_backend

    def __init__(self, hidden: int, num_heads: int, num_kv_heads: int, head_dim: int, *, bias: bool = False,
                 qk_norm_eps: float | None = None) -> None:
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError(f"{num_heads} query heads cannot share {num_kv_heads} key/value heads evenly")
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.q_proj = Linear(hidden, num_heads * head_dim, bias=bias)
        self.k_proj = Linear(hidden, num_kv_heads * head_dim, bias=bias)
        self.v_proj = Linear(hidden, num_kv_heads * head_dim, bias=bias)
        self.o_proj = Linear(num_heads * head_dim, hidden, bias=bias)
        if qk_norm_eps is not None:
            self.q_norm = RMSNorm(head_dim, qk_norm_eps)
            self.k_norm = RMSNorm(head_dim, qk_norm_eps)
        self.qk_norm = qk_norm_eps is not None

    def _heads(self, x: SharedInput, proj: Linear, num_heads: int, norm: RMSNorm | None) -> torch.Tensor:
        """x's rows ([B, T, hidden]) through ``proj`` -> [B, H, T, D], each head normalised first where the layer
        has the norms."""
        b, t, _ = x.x.shape
        heads = x(proj).view(b, t, num_heads, self.head_dim)
        return (heads if norm is None else norm(heads)).transpose(1, 2)

    def forward_cached(self, x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor], cache: SelfAttentionCache,
                       layer: int) -> torch.Tensor:
        """x: [B, T, hidden] new tokens; ``rotary``: their (cos, sin) from ``RotaryEmbedding``; ``layer``: which of
        the cache's layers -> [B, T, hidden]."""
        cos, sin = rotary
        shared = SharedInput(x)  # quantized projections share one quantization of x
        v = self._heads(shared, self.v_proj, self.num_kv_heads, None)
        fused = (self.qk_norm and self.q_norm.use_kernel and rms_norm.supported(x)
                 and not torch.compiler.is_compiling())
        if fused:  # norm + rotation + transpose in one pass
            b, t, _ = x.shape
            q = rms_norm.rms_norm_rotary(shared(self.q_proj).view(b, t, self.num_heads, self.head_dim),
                                         self.q_norm.weight, self.q_norm.eps, cos, sin)
            k = rms_norm.rms_norm_rotary(shared(self.k_proj).view(b, t, self.num_kv_heads, self.head_dim),
                                         self.k_norm.weight, self.k_norm.eps, cos, sin)
        else:
            q = apply_rotary(self._heads(shared, self.q_proj, self.num_heads, self.q_norm if self.qk_norm else None),
                             cos, sin)
            k = apply_rotary(self._heads(shared, self.k_proj, self.num_kv_heads,
                                         self.k_norm if self.qk_norm else None), cos, sin)
        out = cache.attend(layer, q, k, v, use_kernel=self.use_kernel)
        b, _, t, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))
