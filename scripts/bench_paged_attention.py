#!/usr/bin/env python3
"""Times the paged decode-attention kernel (oasr.kernels.paged_attention) over its tile size and warp count on
CUDA, at a Qwen3-1.7B decode shape (grouped key/value heads, long prompts) and two Whisper shapes, to choose the
launch settings ``paged_decode_attention`` uses. ``--cross`` times a decode step's cross-attention at Whisper's
fixed window instead: SDPA over the fp16 slots (the ``auto`` cache) against the paged kernel over e4m3 slots
(``kv_cache_dtype`` fp8), the kernel's tile and warps swept, and the kernel over the fp16 slots with every row
live and with every other row idle (length 0). ``--cross --fp16`` times the fp16 cases alone.

    PYTHONPATH=. python3 scripts/bench_paged_attention.py [--cross [--fp16]]
"""

from __future__ import annotations

import sys

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
                paged_attention._paged_decode_attention_kernel[(h, b)](
                    q, k, v, k_pool, v_pool, k_pool, v_pool, table, positions, out, table.stride(0), table.shape[1],
                    k_pool.stride(0), d**-0.5, NUM_HEADS=h, NUM_KV_HEADS=kv, HEAD_DIM=d, BLOCK_SIZE=block_size,
                    BLOCK_N=block_n, SCALED=False, num_warps=warps)
            us = 1000 * triton.testing.do_bench(launch, warmup=20, rep=100)
            print(f"b={b} h={h} kv={kv} d={d} pos~{pos} BLOCK_N={block_n} warps={warps}: {us:.1f} us", flush=True)


CROSS_SHAPES = (  # rows, heads, head size, encoder positions: large-v3 at 4 and 64 rows, tiny at 64, large-v3 at 256
    (4, 20, 64, 1500),
    (64, 20, 64, 1500),
    (64, 6, 64, 1500),
    (256, 20, 64, 1500),
)


def time_cross(b: int, h: int, d: int, s: int, fp16_only: bool = False) -> None:
    from oasr.layers.attention import sdpa
    from oasr.layers.kv_format import quantize_heads

    k = torch.randn(b, s, h, d, device="cuda", dtype=torch.float16)
    v = torch.randn_like(k)
    q = torch.randn(b, h, 1, d, device="cuda", dtype=torch.float16)
    dense_k, dense_v = k.transpose(1, 2), v.transpose(1, 2)  # the slot store's [B, H, S, D] views
    us = 1000 * triton.testing.do_bench(lambda: sdpa(q, dense_k, dense_v), warmup=20, rep=100)
    moved = 2 * b * s * h * d * 2
    print(f"cross b={b} h={h} s={s} fp16 SDPA: {us:.1f} us ({moved / us / 1e6:.2f} TB/s)", flush=True)
    table = torch.arange(b, device="cuda")[:, None]
    lengths = torch.full((b,), s, device="cuda")
    half_idle = lengths.clone()
    half_idle[::2] = 0  # every other slot idle: what a step reads once half its rows have finished
    pool_k, pool_v = k.flatten(0, 1), v.flatten(0, 1)  # the same slots as a paged pool of one block each
    for splits in (1, 2, 4, 8):
        for name, rows in (("all rows", lengths), ("half idle", half_idle)):
            us = 1000 * triton.testing.do_bench(lambda rows=rows, splits=splits: paged_attention.paged_cross_attention(
                q[:, :, 0], pool_k, pool_v, table, rows, s, splits=splits), warmup=20, rep=100)
            print(f"cross b={b} h={h} s={s} fp16 kernel splits={splits} {name}: {us:.1f} us "
                  f"({moved / us / 1e6:.2f} TB/s of all rows' K/V)", flush=True)
    if fp16_only:
        return
    k8, ks = quantize_heads(k.flatten(0, 1))  # [B * S, H, D] and scales [B * S, H]
    v8, vs = quantize_heads(v.flatten(0, 1))
    k_scale = ks.view(b, s, h).transpose(1, 2).contiguous()  # [slots, H, window]
    v_scale = vs.view(b, s, h).transpose(1, 2).contiguous()
    want = sdpa(q, dense_k, dense_v)[:, :, 0].float()
    moved = 2 * b * s * h * (d + 4)
    timed = []
    for group in (g for g in (1, 2, 4) if h % g == 0):
        for splits in (4, 8):
            for block_n in (16, 32, 64):
                for warps in (1, 2, 4):
                    def launch() -> torch.Tensor:
                        return paged_attention.paged_cross_attention(
                            q[:, :, 0], k8, v8, table, lengths, s, k_scale, v_scale, block_n=block_n,
                            num_warps=warps, splits=splits, heads_per_program=group)
                    error = (launch().float() - want).abs().max().item()
                    us = 1000 * triton.testing.do_bench(launch, warmup=10, rep=50)
                    setting = f"heads={group} splits={splits} BLOCK_N={block_n} warps={warps}"
                    timed.append((us, setting))
                    print(f"cross b={b} h={h} s={s} fp8 {setting}: {us:.1f} us ({moved / us / 1e6:.2f} TB/s, "
                          f"max error against fp16 {error:.3f})", flush=True)
    default = 1000 * triton.testing.do_bench(
        lambda: paged_attention.paged_cross_attention(q[:, :, 0], k8, v8, table, lengths, s, k_scale, v_scale),
        warmup=10, rep=50)
    for us, setting in sorted(timed)[:3]:
        print(f"fastest b={b} h={h}: {setting} {us:.1f} us ({moved / us / 1e6:.2f} TB/s)", flush=True)
    print(f"default b={b} h={h}: {default:.1f} us ({moved / default / 1e6:.2f} TB/s)", flush=True)
    # Rounding a batch's new K/V into the slots: torch's passes against the one-pass kernel.
    from oasr.kernels.kv_store import store_scaled

    rows = torch.arange(b * s, device="cuda")
    fresh = k.flatten(0, 1)
    torch_us = 1000 * triton.testing.do_bench(lambda: quantize_heads(fresh), warmup=5, rep=50)
    kernel_us = 1000 * triton.testing.do_bench(lambda: store_scaled(k8, k_scale, rows, fresh, s), warmup=5, rep=50)
    print(f"store b={b} h={h} s={s}: torch quantize {torch_us:.0f} us, kernel store {kernel_us:.0f} us", flush=True)


if __name__ == "__main__":
    if "--cross" in sys.argv[1:]:
        for shape in CROSS_SHAPES:
            time_cross(*shape, fp16_only="--fp16" in sys.argv[1:])
    else:
        for shape in SHAPES:
            time_shape(*shape)
