#!/usr/bin/env python3
"""FastConformer encoder time: OASR vs transformers' ParakeetEncoder on identical random weights (GPU).

    PYTHONPATH=. python3 scripts/bench_fastconformer_encoder.py --arch parakeet-ctc-1.1b --batch 64 --frames 2000
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch
import triton.testing

from oasr.bench.parakeet import build
from oasr.models.loader import from_pretrained


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--arch", default="parakeet-ctc-1.1b")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--frames", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        _, reference = build(args.arch, Path(tmp))
        loaded = from_pretrained(tmp, device="cuda", dtype="float16")
    reference = reference.to("cuda", torch.float16).eval()
    mels = loaded.config.encoder_config.num_mel_bins
    features = torch.randn(args.batch, mels, args.frames, device="cuda", dtype=torch.float16)
    lengths = torch.randint(args.frames // 10, args.frames + 1, (args.batch,), device="cuda")
    lengths[0] = args.frames
    mask = torch.arange(args.frames, device="cuda")[None] < lengths[:, None]
    with torch.inference_mode():
        ours = triton.testing.do_bench(lambda: loaded.model.encode(features, lengths), warmup=50, rep=300,
                                       return_mode="median")
        theirs = triton.testing.do_bench(
            lambda: reference.encoder(input_features=features.transpose(1, 2), attention_mask=mask),
            warmup=50, rep=300, return_mode="median")
    print(f"{args.arch} batch {args.batch} x {args.frames} frames: OASR {ours:.1f} ms, transformers {theirs:.1f} ms")


if __name__ == "__main__":
    main()
