"""``fp8``: W8A8 in float8 e4m3. Weights per output channel, activations per token (dynamic).

On CUDA devices of compute capability 8.9 or newer (Ada, Hopper) the GEMM is ``torch._scaled_mm`` with row-wise
scales (scale_a [M, 1], scale_b [1, N], float32; float32 accumulation). Elsewhere the layer dequantizes and
multiplies in float32 (``reference``), with the activations rounded to e4m3 per token first, so the numbers are
the kernel's. A CUDA device below 8.9, or a torch build without ``_scaled_mm``, is refused.
"""

from __future__ import annotations

import torch

from oasr.quantization import QUANT_METHODS
from oasr.quantization.method import QuantMethod

FP8 = torch.float8_e4m3fn


@QUANT_METHODS.register("fp8")
class Fp8Method(QuantMethod):
    name = "fp8"
    storage_dtype = FP8
    qmax = float(torch.finfo(FP8).max)  # 448
    smooths = False  # e4m3's exponent covers activation outliers; per-token scales are enough
    fast_lane = "scaled_mm"
    torch_op = "_scaled_mm"
    min_capability = (8, 9)
    below_capability = "fp8 GEMMs need {} or newer (Ada, Hopper); use int8"
    shape_multiple = 16  # _scaled_mm's operands: K and N multiples of 16

    def _cast(self, scaled: torch.Tensor) -> torch.Tensor:
        return scaled.clamp(-self.qmax, self.qmax).to(FP8)

    def run_quantized(self, lane: str, quantized: tuple[torch.Tensor, torch.Tensor], weight: torch.Tensor,
                      scale: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
        if lane != self.fast_lane:
            return super().run_quantized(lane, quantized, weight, scale, bias, dtype)
        qx, sx = quantized
        # The bias in the GEMM's epilogue where _scaled_mm takes it (fp16, bf16): a separate add is another pass
        # over the output (at 24,000 x 5,120 on the H200, 0.63 ms against the GEMM's 0.28; in the epilogue 0.29).
        in_epilogue = bias is not None and bias.dtype == dtype and dtype in (torch.float16, torch.bfloat16)
        out = torch._scaled_mm(qx, weight.t(), scale_a=sx, scale_b=scale.view(1, -1),
                               bias=bias if in_epilogue else None, out_dtype=dtype)
        return out if bias is None or in_epilogue else out.add_(bias)
