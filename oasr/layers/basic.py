"""Parameter-holding layers of the waist.

They keep torch's parameter names (``weight``, ``bias``) so checkpoints load by key, and each names the kernel
op that would replace its forward under the ``kernels`` backend (``KERNEL_OP``).
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn


class Linear(nn.Linear):
    KERNEL_OP: ClassVar[str] = "linear"


class LayerNorm(nn.LayerNorm):
    KERNEL_OP: ClassVar[str] = "layer_norm"


class Conv1d(nn.Conv1d):
    KERNEL_OP: ClassVar[str] = "conv1d"


class Embedding(nn.Embedding):
    KERNEL_OP: ClassVar[str] = "embedding"


class GELU(nn.Module):
    """Exact (erf) GELU, as Whisper and most speech encoders were trained with."""

    KERNEL_OP: ClassVar[str] = "gelu"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x)
