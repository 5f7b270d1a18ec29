"""``int8``: W8A8 in int8, symmetric. Weights per output channel, activations per token (dynamic), usually
after SmoothQuant has moved the activations' outlier channels into the weights (``oasr.quantization.smooth``).

On CUDA devices of compute capability 8.0 or newer the GEMM is ``torch._int_mm`` (int8 x int8 -> exact int32
sums), then rescaled by both scales in float32. cuBLAS's int8 path wants more than 16 rows and K, N multiples of
8: fewer rows are padded with zeros, and a layer of another shape runs the reference lane. On the CPU the layer
dequantizes and multiplies in float32 (``reference``): ``torch._int_mm`` runs there too, with the same sums, but
about 20 times slower than a float32 product (torch 2.13, one thread); the equivalence tests run both lanes.
"""

from __future__ import annotations

import torch

from oasr.kernels import w8a8
from oasr.kernels.runtime import triton_runs_on
from oasr.quantization import QUANT_METHODS
from oasr.quantization.method import QuantMethod

_INT_MM_MIN_ROWS = 17  # torch._int_mm on CUDA: "self.size(0) needs to be greater than 16"


@QUANT_METHODS.register("int8")
class Int8Method(QuantMethod):
    name = "int8"
    storage_dtype = torch.int8
    qmax = 127.0
    smooths = True
    fast_lane = "int_mm"
    torch_op = "_int_mm"
    min_capability = (8, 0)
    below_capability = "int8 GEMMs need {} or newer here"
    shape_multiple = 8

    def _cast(self, scaled: torch.Tensor) -> torch.Tensor:
        return scaled.round().clamp(-self.qmax, self.qmax).to(torch.int8)

    def run_quantized(self, lane: str, quantized: tuple[torch.Tensor, torch.Tensor], weight: torch.Tensor,
                      scale: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
        if lane != self.fast_lane:
            return super().run_quantized(lane, quantized, weight, scale, bias, dtype)
        qx, sx = quantized
        rows = qx.shape[0]
        if qx.is_cuda and rows < _INT_MM_MIN_ROWS:
            qx = torch.cat([qx, qx.new_zeros(_INT_MM_MIN_ROWS - rows, qx.shape[1])])
        acc = torch._int_mm(qx, weight.t())
        if triton_runs_on(acc):
            return w8a8.dequantize_int32(acc, sx, scale, bias, dtype)
        out = acc[:rows].float() * sx * scale
        if bias is not None:
            out = out + bias.float()
        return out.to(dtype)
