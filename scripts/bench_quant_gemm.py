"""Times one quantized ``Linear`` against fp16 on CUDA, at Whisper large-v3's GEMM shapes.

    python scripts/bench_quant_gemm.py            # needs a CUDA device; prints a table, milliseconds per call

The quantized times include the per-token activation quantization (the torch passes before each GEMM). It
imports torch and the waist only, so it runs where the audio stack is not installed. For whole-model numbers use
``oasr bench --quantization fp8|int8``.
"""

from __future__ import annotations

import torch

from oasr.layers import Linear
from oasr.quantization.apply import method_named

# (name, K, N) of large-v3: attention projections, fc1, fc2.
SHAPES = (("qkvo", 1280, 1280), ("fc1", 1280, 5120), ("fc2", 5120, 1280))
ROWS = (8, 64, 1500, 24000)  # a decode step of 8 and 64 rows; one and sixteen encoder windows


def _time_ms(fn, repeats: int = 50) -> float:
    for _ in range(5):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats


def main() -> None:
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(f"{'gemm':6s} {'rows':>6s} {'fp16 ms':>9s} {'fp8 ms':>9s} {'int8 ms':>9s} {'q torch':>9s} {'q kernel':>9s}")
    fp8 = method_named("fp8")
    with torch.inference_mode():
        for name, k, n in SHAPES:
            layers = {}
            for method in (None, "fp8", "int8"):
                layer = Linear(k, n).cuda().half()
                if method is not None:
                    m = method_named(method)
                    q, scale = m.quantize_weight(layer.weight)
                    layer.set_quantized(m.bind(torch.device("cuda"), tuple(q.shape)), q, scale)
                layers[method] = layer
            for rows in ROWS:
                x = torch.randn(rows, k, device="cuda", dtype=torch.float16)
                times = [_time_ms(lambda layer=layer: layer(x)) for layer in layers.values()]
                # The activation's quantization alone: torch's passes, and the one-pass kernel the lanes use.
                times += [_time_ms(lambda: fp8.quantize_activation(x)),
                          _time_ms(lambda: fp8.quantize_activation_fused(x))]
                print(f"{name:6s} {rows:6d} " + " ".join(f"{t:9.4f}" for t in times))
        epilogues(fp8)


def epilogues(fp8) -> None:
    """fp8's GEMM at 24,000 rows, the bias added after it against in its epilogue (``_scaled_mm(bias=)``), with
    and without fast accumulation, in fp16 and bf16 output: which of these torch's build serves, at what cost."""
    print(f"{'gemm':6s} {'variant':28s} {'ms':>9s}")
    for name, k, n in SHAPES:
        x = torch.randn(24000, k, device="cuda", dtype=torch.float16)
        w, ws = fp8.quantize_weight(torch.randn(n, k, device="cuda", dtype=torch.float16) * 0.05)
        qx, sx = fp8.quantize_activation_fused(x)
        for dtype in (torch.float16, torch.bfloat16):
            bias = torch.randn(n, device="cuda", dtype=dtype)
            for fast in (False, True):
                def plain(fast=fast, dtype=dtype):
                    return torch._scaled_mm(qx, w.t(), scale_a=sx, scale_b=ws.view(1, -1), out_dtype=dtype,
                                            use_fast_accum=fast)
                variants = {"no bias": plain, "then add_": lambda plain=plain, bias=bias: plain().add_(bias),
                            "bias= epilogue": lambda fast=fast, dtype=dtype, bias=bias: torch._scaled_mm(
                                qx, w.t(), scale_a=sx, scale_b=ws.view(1, -1), bias=bias, out_dtype=dtype,
                                use_fast_accum=fast)}
                for label, fn in variants.items():
                    tag = f"{str(dtype)[6:]} {'fast ' if fast else ''}{label}"
                    try:
                        print(f"{name:6s} {tag:28s} {_time_ms(fn):9.4f}")
                    except (RuntimeError, NotImplementedError) as exc:
                        print(f"{name:6s} {tag:28s} refused: {str(exc).splitlines()[0][:80]}")


if __name__ == "__main__":
    main()
