"""The quantization methods' CUDA kernels (``torch._scaled_mm``, ``torch._int_mm``) against their dequantize-and-
multiply reference on the same device, and a quantized Whisper forward, decoded under CUDA graphs' shapes.

Kept apart from tests/test_quantization.py so that it imports torch and the waist only."""

from __future__ import annotations

import pytest
import torch

from oasr.models import ARCHITECTURES
from oasr.quantization import QUANT_METHODS
from oasr.quantization.apply import method_named, quantizable, quantize_weights

pytestmark = pytest.mark.gpu
FAST_LANES = {"fp8": "scaled_mm", "int8": "int_mm"}
ACCUMULATOR_TOLERANCE = {"fp8": 2e-3}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows", [1, 7, 17, 300])
@pytest.mark.parametrize("name", QUANT_METHODS.names())
def test_cuda_lane_equals_the_reference(name: str, rows: int, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    method = method_named(name)
    w = torch.randn(1280, 512, device="cuda") * 0.05
    x = torch.randn(rows, 512, device="cuda").to(dtype)
    bias = torch.randn(1280, device="cuda").to(dtype)
    q, scale = method.quantize_weight(w)
    lane = method.bind(torch.device("cuda"), tuple(w.shape)).lane
    assert lane == FAST_LANES[name]
    fast = method.run(lane, x, q, scale, bias)
    reference = method.reference(x, q, scale, bias)
    assert fast.dtype == dtype and fast.shape == (rows, 1280)
    tolerance = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
    # Hopper's fp8 tensor cores accumulate in less than float32 (cuBLAS only promotes partial sums to it now and
    # then): even a float32 output carries sums about as precise as fp16's. Measured on the H200: 6e-4 at most.
    tolerance = max(tolerance, ACCUMULATOR_TOLERANCE.get(name, 0.0))
    torch.testing.assert_close(fast.float(), reference.float(), rtol=tolerance, atol=tolerance * 4)


@pytest.mark.parametrize("name", QUANT_METHODS.names())
def test_quantized_whisper_runs_on_cuda_close_to_its_cpu_oracle(name: str) -> None:
    torch.manual_seed(0)
    arch = ARCHITECTURES.get("whisper")
    config = arch.tiny_config()
    model = arch.from_config(config).eval()
    quantize_weights(model, method_named(name), tuple(quantizable(model)))
    features, tokens = arch.example_inputs(config)
    with torch.inference_mode():
        cpu = model(features, tokens)
        model = model.to("cuda", torch.float16)
        lanes = {layer.quant_gemm.lane for layer in quantizable(model).values()}
        assert lanes == {FAST_LANES[name]}
        gpu = model(features.cuda().half(), tokens.cuda()).float().cpu()
    assert (gpu - cpu).norm() < 0.05 * cpu.norm()


@pytest.mark.parametrize("name", QUANT_METHODS.names())
def test_compiled_quantized_encoder_matches_eager(name: str) -> None:
    """Under torch.compile most activations' quantization is torch's ops, fused by the compiler into the LayerNorm
    (or transpose) before the GEMM instead of the Triton pass; the encoder computes the same function (the
    compiler's division may round a last bit differently, so a few values land one e4m3 or int8 step apart)."""
    torch.manual_seed(0)
    arch = ARCHITECTURES.get("whisper")
    config = arch.tiny_config()
    model = arch.from_config(config).eval()
    quantize_weights(model, method_named(name), tuple(quantizable(model)))
    model = model.to("cuda", torch.float16)
    features = arch.example_inputs(config, batch_size=3)[0].cuda()
    torch._dynamo.reset()
    with torch.inference_mode():
        eager = model.encode(features).hidden.float()
        compiled = torch.compile(model.encode)(features).hidden.float()
    assert (compiled - eager).norm() < 0.02 * eager.norm()
