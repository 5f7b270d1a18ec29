"""One activation read by several GEMMs of the waist.

A layer's q, k and v projections read the same normalised rows; every decoder layer's cross-attention keys and
values read the same encoder output. A float layer multiplies the rows as they are. A quantized layer must first
quantize them per token, a pass over the whole activation that at an encoder's row counts costs as much as the
8-bit GEMM's own saving (docs/quantization.md): ``SharedInput`` makes that quantization once for every layer
that quantizes its input the same way (``QuantizedGemm.activation_key``), instead of once per layer.

A quantized layer is run through its GEMM's ``quantize`` and ``multiply``, not its ``forward``: forward hooks on
it do not fire here.
"""

from __future__ import annotations

import torch

from oasr.layers.basic import Linear


class SharedInput:
    """x [..., K]; ``shared(layer)`` is ``layer(x)`` [..., N], with ``x``'s quantizations made at most once each."""

    def __init__(self, x: torch.Tensor) -> None:
        self.x = x
        self._quantized: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def rows(self) -> torch.Tensor:
        """x as rows [M, K]."""
        return self.x.reshape(-1, self.x.shape[-1])

    def __call__(self, layer: Linear) -> torch.Tensor:
        gemm = layer.quant_gemm
        if gemm is None:
            return layer(self.x)
        key = gemm.activation_key
        if key not in self._quantized:
            self._quantized[key] = gemm.quantize(self.rows)
        out = gemm.multiply(self._quantized[key], layer, self.x.dtype)
        return out.view(*self.x.shape[:-1], out.shape[-1])
