#!/usr/bin/env python3
"""Times the paged decode-attention kernel (oasr.kernels.paged_attention) over its tile size and warp count on
CUDA, at a Qwen3-1.7B decode shape (grouped key/value heads, long prompts) and two Whisper shapes, to choose the
launch settings ``paged_decode_attention`` uses.

    PYTHONPATH=. python3 scripts/bench_paged_attention.py
"""

from __future__ import annotations

import torch
import triton

from oasr.kernels import paged_attention

SHAPES = (  # rows, query heads, key/value heads, head size, typical position
    (256, 16, 8, 128, 200),
    (64, 20, 20, 64, 60),
    (256, 6, 6, 64, 40),
)


def time_shape(b: int, h: int, kv: int, d: int, pos: int, block_size: int = 16) -> None:
    nb = (pos + 40) // block_size + 1
    k_pool = torch.randn((1 + b * nb) * block_size, kv, d, device="cuda", dtype=torch.float16)
    v_pool = torch.randn_like(k_pool)
    table = (1 + torch.randperm(b * nb, device="cuda")).view(b, nb).int()
    positions = torch.randint(pos - 30, pos + 30, (b,), device="cuda")
    q = torch.randn(b, h, d, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(b, kv, d, device="cuda", dtype=torch.float16) for _ in range(2))
    out = torch.empty_like(q)
    for block_n in (16, 32, 64, 128):
        for warps in (1, 2, 4, 8):
            def launch() -> None:
                paged_attention._paged_decode_attention_kernel[(b, h)](
                    q, k, v, k_pool, v_pool, table, positions, out, table.stride(0), table.shape[1],
                    k_pool.stride(0), d**-0.5, NUM_HEADS=h, NUM_KV_HEADS=kv, HEAD_DIM=d, BLOCK_SIZE=block_size,
                    BLOCK_N=block_n, num_warps=warps)
            us = 1000 * triton.testing.do_bench(launch, warmup=20, rep=100)
            print(f"b={b} h={h} kv={kv} d={d} pos~{pos} BLOCK_N={block_n} warps={warps}: {us:.1f} us", flush=True)


if __name__ == "__main__":
    for shape in SHAPES:
        time_shape(*shape)
