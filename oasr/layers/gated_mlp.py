"""The gated feed-forward block of Llama / Qwen decoders (SwiGLU when the activation is SiLU).

``down_proj(act(gate_proj(x)) * up_proj(x))``, the three projections without biases, named as the checkpoints
name them. Under the ``kernels`` backend a SiLU gate runs in one pass (``oasr.kernels.gated``).
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from oasr.layers.basic import Linear, SiLU, activation
from oasr.layers.shared_input import SharedInput


class GatedMLP(nn.Module):
    """x [..., hidden] -> [..., hidden] through ``intermediate`` gated units; ``act``: a Hugging Face
    ``hidden_act`` name (``oasr.layers.activation``)."""

    KERNEL_OP: ClassVar[str] = "gated_mlp"
    use_kernel = False  # set by oasr.layers.apply_backend

    def __init__(self, hidden: int, intermediate: int, act: str = "silu", *, bias: bool = False) -> None:
        super().__init__()
        self.gate_proj = Linear(hidden, intermediate, bias=bias)
        self.up_proj = Linear(hidden, intermediate, bias=bias)
        self.down_proj = Linear(intermediate, hidden, bias=bias)
        self.act_fn = activation(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shared = SharedInput(x)  # quantized gate and up projections share one quantization of x
        gate, up = shared(self.gate_proj), shared(self.up_proj)
        if self.use_kernel and isinstance(self.act_fn, SiLU) and not torch.compiler.is_compiling():
            from oasr.kernels import gated

            return self.down_proj(gated.silu_mul(gate, up))
        return self.down_proj(self.act_fn(gate) * up)
