#!/usr/bin/env python3
"""Encoder throughput at one shape under different attention backends and with torch.compile (GPU).

    PYTHONPATH=. python3 scripts/bench_encoder.py --arch whisper-large-v3 --batch 64
"""

from __future__ import annotations

import argparse
import contextlib

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from oasr.bench.random_model import WHISPER_SHAPES
from oasr.models import ARCHITECTURES


def flops(config, batch: int) -> float:
    t, d, f = config.max_source_positions, config.d_model, config.encoder_ffn_dim
    per_layer = 2 * t * (4 * d * d + 2 * d * f) + 4 * t * t * d
    return batch * config.encoder_layers * per_layer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--arch", default="whisper-large-v3")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--quantization", choices=("fp8", "int8"), help="quantize the encoder's GEMMs first")
    parser.add_argument("--profile", action="store_true", help="print the CUDA kernels of one forward, by time")
    args = parser.parse_args()
    import triton.testing

    config = WHISPER_SHAPES[args.arch]
    dtype = getattr(torch, args.dtype)
    model = ARCHITECTURES.get("whisper").from_config(config).eval()
    if args.quantization:  # on the host, as loading does; the quantized layers move with the model
        from oasr.quantization.apply import method_named, quantizable, quantize_weights

        quantize_weights(model, method_named(args.quantization), tuple(quantizable(model)))
    model = model.to("cuda", dtype)
    features = torch.randn(args.batch, config.num_mel_bins, 3000, device="cuda", dtype=dtype)
    encoder = model.model.encoder
    variants = {
        "default": contextlib.nullcontext,
        "flash": lambda: sdpa_kernel([SDPBackend.FLASH_ATTENTION]),
        "cudnn": lambda: sdpa_kernel([SDPBackend.CUDNN_ATTENTION]),
        "efficient": lambda: sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]),
    }
    total = flops(config, args.batch)
    with torch.inference_mode():
        for name, ctx in variants.items():
            try:
                with ctx():
                    ms = triton.testing.do_bench(lambda: encoder(features), warmup=100, rep=500, return_mode="median")
                print(f"{name:10s} {ms:8.2f} ms  {total / ms / 1e9:6.0f} TFLOP/s")
            except RuntimeError as exc:
                print(f"{name:10s} failed: {str(exc)[:100]}")
        if args.profile:
            print_profile("eager", lambda: encoder(features))
        if args.compile:
            for name, ctx in (("compiled", contextlib.nullcontext), ("cmp+cudnn", variants["cudnn"])):
                torch._dynamo.reset()
                try:
                    with ctx():
                        compiled = torch.compile(encoder)  # as the engine compiles it
                        compiled(features)
                        ms = triton.testing.do_bench(lambda: compiled(features), warmup=100, rep=500,
                                                     return_mode="median")
                        print(f"{name:10s} {ms:8.2f} ms  {total / ms / 1e9:6.0f} TFLOP/s")
                        if args.profile:
                            print_profile(name, lambda: compiled(features))
                except RuntimeError as exc:
                    print(f"{name:10s} failed: {str(exc)[:100]}")


def print_profile(name: str, forward) -> None:
    """One forward's kernels: the time by kind, then the ten largest."""
    from oasr.bench.profiling import device_kernels, time_by_kind

    forward()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        forward()
        torch.cuda.synchronize()
    kernels = device_kernels(prof.key_averages())
    print(f"-- {name}: " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in time_by_kind(kernels).items()))
    for e in sorted(kernels, key=lambda e: -e.self_device_time_total)[:10]:
        print(f"   {e.self_device_time_total / 1e3:8.2f} ms {e.count:5d}x {e.key[:100]}")

if __name__ == "__main__":
    main()
