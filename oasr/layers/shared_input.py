"""One activation read by several GEMMs of the waist.

A layer's q, k and v projections read the same normalised rows; every decoder layer's cross-attention keys and
values read the same encoder output. A float layer multiplies the rows as they are. A quantized layer must first
quantize them per token, a pass over the whole activation that at an encoder's row counts costs as much as the
8-bit GEMM's own saving (docs/quantization.md): ``SharedInput`` makes that quantization once for every layer
bound to the same method and lane, instead of once per layer.
"""

from __future__ import annotations

import torch

from oasr.layers.basic import Linear


class SharedInput:
    """x [..., K]; ``shared(layer)`` is ``layer(x)`` [..., N], with ``x``'s quantizations made at most once each."""

    def __init__(self, x: torch.Tensor) -> None:
        self.x = x
        self._rows = x.reshape(-1, x.shape[-1])
        self._quantized: dict[tuple[str, str], tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(self, layer: Linear) -> torch.Tensor:
        gemm = layer.quant_gemm
        if gemm is None:
            return layer(self.x)
        key = (gemm.method.name, gemm.lane)
        if key not in self._quantized:
            self._quantized[key] = gemm.quantize(self._rows)
        out = gemm.multiply(self._quantized[key], layer, self.x.dtype)
        return out.view(*self.x.shape[:-1], out.shape[-1])
