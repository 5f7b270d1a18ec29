#!/usr/bin/env python3
"""FastConformer convolution subsampling time on CUDA: the torch path (NCHW through cuDNN) against the kernels
path (oasr.kernels.subsampling, channels last), on random weights, checking that they agree on real frames.

    PYTHONPATH=. python3 scripts/bench_subsampling.py                  # B=256, 1400 frames (14 s), fp16
    PYTHONPATH=. python3 scripts/bench_subsampling.py --full --sweep   # every row full; try other kernel tiles
"""

from __future__ import annotations

import argparse

import torch
import triton.testing

from oasr.kernels import subsampling
from oasr.kernels.subsampling import Tile
from oasr.models.fastconformer.config import FastConformerEncoderConfig
from oasr.models.fastconformer.encoder import ConvSubsampling, frame_mask

SWEEP = [Tile(16, 128), Tile(32, 64), Tile(32, 128), Tile(64, 64), Tile(64, 128), Tile(64, 128, 8), Tile(128, 64, 8),
         Tile(64, 256, 8), Tile(128, 128, 8)]


def bench(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def real_frame_error(got: tuple[torch.Tensor, torch.Tensor], want: tuple[torch.Tensor, torch.Tensor]) -> float:
    assert torch.equal(got[1], want[1]) and got[0].shape == want[0].shape
    real = frame_mask(want[1], want[0].shape[1])
    return (got[0].float() - want[0].float())[real].abs().max().item()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--frames", type=int, default=1400)
    parser.add_argument("--full", action="store_true", help="every row as long as the batch (default: max/7..max)")
    parser.add_argument("--sweep", action="store_true", help="also time each kernel with other tiles")
    parser.add_argument("--cudnn-benchmark", action="store_true")
    parser.add_argument("--device", default="cuda", help="cpu only for a smoke run under TRITON_INTERPRET=1")
    args = parser.parse_args()
    device = args.device
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    torch.manual_seed(0)
    config = FastConformerEncoderConfig(hidden_size=1024, subsampling_conv_channels=256, num_mel_bins=80)
    module = ConvSubsampling(config).eval().to(device)
    b, t = args.batch, args.frames
    lengths = torch.full((b,), t, device=device) if args.full else torch.randint(t // 7, t + 1, (b,), device=device)
    lengths[0] = t
    features = torch.randn(b, t, 80, device=device) * frame_mask(lengths, t)[..., None]
    with torch.inference_mode():
        exact = module(features, lengths)  # float32, for how far each half-precision path strays
        module.half()
        x = features.half()
        torch_path = module(x, lengths)
        module.use_kernel = True
        kernel_path = module(x, lengths)
        print(f"real-frame error vs float32: torch fp16 {real_frame_error(torch_path, exact):.3e}, "
              f"kernels fp16 {real_frame_error(kernel_path, exact):.3e}; kernels vs torch "
              f"{real_frame_error(kernel_path, torch_path):.3e} (output max {exact[0].abs().max().item():.2f})")
        module.use_kernel = False
        torch_ms = bench(lambda: module(x, lengths))
        module.use_kernel = True
        kernel_ms = bench(lambda: module(x, lengths))
        print(f"batch {b} x {t} frames ({'full' if args.full else 'mixed lengths'}), fp16: "
              f"torch {torch_ms:.2f} ms, kernels {kernel_ms:.2f} ms ({torch_ms / kernel_ms:.1f}x)")
        stages(module, x, lengths, args.sweep)


def stages(module: ConvSubsampling, x: torch.Tensor, lengths: torch.Tensor, sweep: bool) -> None:
    """Time of each piece of the kernels path, and of each kernel under the other tiles of ``SWEEP``."""
    (w1, b1), (w2, b2), (w3, b3) = module.kernel_weights()[:3]
    stride = module.stride
    first = subsampling.first_conv_depthwise(x, lengths, w1, b1, w2, b2, stride)
    lengths2 = module.strided_length(module.strided_length(lengths))
    pointwise = torch.nn.functional.linear(first, module.layers[3].weight[:, :, 0, 0], module.layers[3].bias)
    second = subsampling.relu_depthwise(pointwise, lengths2, w3, b3, stride)
    print(f"  first conv + depthwise {tuple(first.shape)}: "
          f"{bench(lambda: subsampling.first_conv_depthwise(x, lengths, w1, b1, w2, b2, stride)):.2f} ms")
    print(f"  pointwise 1 (matmul): "
          f"{bench(lambda: torch.nn.functional.linear(first, module.layers[3].weight[:, :, 0, 0])):.2f} ms")
    print(f"  relu + depthwise {tuple(second.shape)}: "
          f"{bench(lambda: subsampling.relu_depthwise(pointwise, lengths2, w3, b3, stride)):.2f} ms")
    if not sweep:
        return
    for tile in SWEEP:
        got_first = subsampling.first_conv_depthwise(x, lengths, w1, b1, w2, b2, stride, tile)
        got_second = subsampling.relu_depthwise(pointwise, lengths2, w3, b3, stride, tile)
        for got, want in ((got_first, first), (got_second, second)):  # the same sums in the same order
            assert (got - want).abs().max().item() <= 1e-3 * want.abs().max().item(), tile
        a = bench(lambda tile=tile: subsampling.first_conv_depthwise(x, lengths, w1, b1, w2, b2, stride, tile))
        c = bench(lambda tile=tile: subsampling.relu_depthwise(pointwise, lengths2, w3, b3, stride, tile))
        print(f"  {tile}: first conv + depthwise {a:.2f} ms, relu + depthwise {c:.2f} ms")
    print(f"  (defaults: first conv + depthwise {subsampling.FIRST_TILE}, relu + depthwise {subsampling.DEPTHWISE_TILE})")


if __name__ == "__main__":
    main()
