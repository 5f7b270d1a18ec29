"""Root-mean-square normalisation (the Llama / Qwen family's norm).

``RMSNorm`` scales each vector by the inverse of its root mean square, computed in float32, then by a learned
gain; it has no bias and does not centre. The normalised values are cast back to the input's dtype before the
gain multiplies them, as transformers' ``Qwen3RMSNorm`` does, so fp16 and bf16 runs round where the reference does.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn


class RMSNorm(nn.Module):
    """x [..., dim] -> weight * x / sqrt(mean(x^2) + eps) over the last axis. Parameter ``weight`` [dim]."""

    KERNEL_OP: ClassVar[str] = "rms_norm"

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)
