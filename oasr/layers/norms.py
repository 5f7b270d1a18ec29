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
    use_kernel = False  # set by oasr.layers.apply_backend

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.add_forward(x, None)[1]

    def add_forward(self, x: torch.Tensor, delta: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (s = x + delta (x when delta is None), norm(s)): one pass under the kernels backend."""
        from oasr.kernels import rms_norm

        if self.use_kernel and rms_norm.supported(x) and not torch.compiler.is_compiling():
            return rms_norm.add_rms_norm(x, delta, self.weight, self.eps)
        return rms_norm.add_rms_norm_reference(x, delta, self.weight, self.eps)
