"""Attention itself, on ``torch.nn.functional.scaled_dot_product_attention``: what the attention modules
(``attention.py``) and the cache seams that attend (``cache.py``) both run, in a module of its own so the cache
seams do not import the modules that hold them."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    is_causal: bool = False,
) -> torch.Tensor:
    """q: [B, H, Tq, D]; k, v: [B, Hkv, Tk, D]; mask: bool [B|1, 1, Tq, Tk] (True = attend) -> [B, H, Tq, D].
    Hkv may divide H (grouped key/value heads): key/value head j then serves query heads j*H/Hkv .. (j+1)*H/Hkv-1."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal,
                                          enable_gqa=k.shape[1] != q.shape[1])
