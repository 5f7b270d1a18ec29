#!/usr/bin/env python3
"""Qwen3-ASR's convolution front (three stride-2 3x3 convolutions with GELU, then ``conv_out``) at one batch of
1 s chunks, in the layouts and cuDNN settings that decide its speed (GPU).

    PYTHONPATH=. python3 scripts/bench_conv_front.py --chunks 2048

Each variant's output is compared with the default's (largest absolute difference), so a faster layout that
computes something else shows.
"""

from __future__ import annotations

import argparse
import contextlib

import torch

from oasr.bench.qwen3_asr import QWEN3_ASR_SHAPES
from oasr.models.qwen3_asr.config import Qwen3AudioEncoderConfig
from oasr.models.qwen3_asr.encoder import Qwen3AudioEncoder, one_channel_conv


def front(encoder: Qwen3AudioEncoder, x: torch.Tensor, channels_last: bool, taps: bool = False) -> torch.Tensor:
    """The front as cuDNN convolutions (``taps``: the first one as the encoder runs it, a matmul of its taps)."""
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    x = encoder.gelu(one_channel_conv(encoder.conv2d1, x) if taps else encoder.conv2d1(x))
    for conv in (encoder.conv2d2, encoder.conv2d3):
        x = encoder.gelu(conv(x))
    n, channels, bins, steps = x.shape
    return encoder.conv_out(x.permute(0, 3, 1, 2).reshape(n * steps, channels * bins))  # dense rows, as the encoder


@contextlib.contextmanager
def cudnn_benchmark(on: bool):
    previous = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = on
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = previous


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--arch", default="qwen3-asr-1.7b", choices=sorted(QWEN3_ASR_SHAPES))
    parser.add_argument("--chunks", type=int, default=2048)
    parser.add_argument("--dtype", default="float16")
    args = parser.parse_args()
    import triton.testing

    dtype = getattr(torch, args.dtype)
    config = Qwen3AudioEncoderConfig(**QWEN3_ASR_SHAPES[args.arch][0])
    encoder = Qwen3AudioEncoder(config).eval().to("cuda", dtype)
    for conv in (encoder.conv2d1, encoder.conv2d2, encoder.conv2d3):
        torch.nn.init.normal_(conv.weight, std=0.05)
    x = torch.randn(args.chunks, 1, config.num_mel_bins, config.chunk_frames, device="cuda", dtype=dtype)
    c = config.downsample_hidden_size
    b, t = config.num_mel_bins, config.chunk_frames
    macs = 0
    for c_in in (1, c, c):
        b, t = (b + 1) // 2, (t + 1) // 2
        macs += b * t * c * c_in * 9
    macs += t * c * b * config.d_model
    total = 2 * macs * args.chunks
    with torch.inference_mode():
        reference = front(encoder, x, False)
        layouts = {"nchw": False, "channels_last": True}
        for bench in (False, True):
            for layout, last in layouts.items():
                with cudnn_benchmark(bench):
                    out = front(encoder, x, last)
                    ms = triton.testing.do_bench(lambda: front(encoder, x, last), warmup=20, rep=200,
                                                 return_mode="median")
                diff = (out.float() - reference.float()).abs().max().item()
                print(f"{layout:14s} cudnn.benchmark={bench!s:5s} {ms:8.2f} ms {total / ms / 1e9:6.0f} TFLOP/s "
                      f"max diff {diff:.2e}")
        out = front(encoder, x, False, taps=True)
        ms = triton.testing.do_bench(lambda: front(encoder, x, False, taps=True), warmup=20, rep=200,
                                     return_mode="median")
        diff = (out.float() - reference.float()).abs().max().item()
        print(f"first conv as taps matmul      {ms:8.2f} ms {total / ms / 1e9:6.0f} TFLOP/s max diff {diff:.2e}")
        for last in (False, True):
            torch._dynamo.reset()
            compiled = torch.compile(lambda y: front(encoder, y, last))
            out = compiled(x)
            ms = triton.testing.do_bench(lambda: compiled(x), warmup=20, rep=200, return_mode="median")
            diff = (out.float() - reference.float()).abs().max().item()
            print(f"compiled {'cl' if last else 'nchw':5s}              {ms:8.2f} ms {total / ms / 1e9:6.0f} TFLOP/s "
                  f"max diff {diff:.2e}")
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            front(encoder, x, False)
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=8, max_name_column_width=90))


if __name__ == "__main__":
    main()
