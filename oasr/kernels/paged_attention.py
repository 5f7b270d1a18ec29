"""Decode-step self-attention over the engine's paged K/V pool, in one pass per layer.

A decode step brings one new token per row. In torch its self-attention is five passes per layer: write the new
keys, write the new values, gather each row's keys and values from its blocks into dense [B, L, H, D] copies,
then SDPA over them with a position mask. This kernel stores the new key and value, walks each row's block
table to read the cached positions where they lie, and attends with an online softmax in float32: one launch,
and no dense copies. The new position is scored from registers, not read back. Grouped key/value heads (Llama,
Qwen3) are read where they lie by each query head they serve: no expanded copies either.

``paged_cross_attention`` is the same walk without the store, over a request's encoder positions (the engine's
paged cross-attention pool, for models whose requests attend to audio of their own length, and a fixed window's
slots held in e4m3, each slot one block of the window's length).

A pool may hold e4m3 values with a scale per position and head (``oasr.layers.kv_format``): the decode kernel
then rounds the new key and value as the pool will hold them, stores them with their scales, and both kernels
scale each tile as they read it.

The ``*_reference`` functions are the torch paths; they serve where Triton cannot run and in the equivalence
tests.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from oasr.kernels.runtime import per_head_kernel_runs_on
from oasr.layers import kv_format

try:
    import triton
    import triton.language as tl
except ImportError:  # the torch reference serves
    triton = None


def paged_decode_attention_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
    block_table: torch.Tensor, positions: torch.Tensor, block_size: int,
    k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """q: [B, H, D] of each row's new token; k, v: [B, Hkv, D] (Hkv divides H: each key/value head serves
    H / Hkv consecutive query heads); k_pool, v_pool: [rows, Hkv, D] (one layer of the pool); block_table: [B, nb]
    block ids; positions: [B] of the new tokens -> [B, H, D]. ``k_scale``, ``v_scale``: [blocks, Hkv, block_size]
    when the pool holds e4m3 values (``oasr.layers.kv_format``).

    Stores k and v at each row's position, then attends over positions 0 .. position of the row (through its
    blocks). Positions past the table (idle rows) go to its last block, as ``paged_context`` does."""
    nb = block_table.shape[1]
    block = block_table.gather(1, (positions // block_size).clamp(max=nb - 1)[:, None])[:, 0]
    write_rows = block * block_size + positions % block_size
    kv_format.store(k_pool, k_scale, write_rows, k, block_size)
    kv_format.store(v_pool, v_scale, write_rows, v, block_size)
    read_rows = (block_table[:, :, None] * block_size + torch.arange(block_size, device=q.device)).flatten(1)
    mask = (torch.arange(read_rows.shape[1], device=q.device)[None, :] <= positions[:, None])[:, None, None, :]
    group = q.shape[1] // k.shape[1]
    keys = kv_format.gather(k_pool, k_scale, read_rows, block_size, q.dtype).transpose(1, 2)  # [B, Hkv, L, D]
    values = kv_format.gather(v_pool, v_scale, read_rows, block_size, q.dtype).transpose(1, 2)
    keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)  # [B, H, L, D]
    return F.scaled_dot_product_attention(q[:, :, None], keys, values, attn_mask=mask)[:, :, 0]


def paged_cross_attention_reference(
    q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, block_table: torch.Tensor, lengths: torch.Tensor,
    block_size: int, k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """q: [B, H, D]; k_pool, v_pool: [rows, H, D]; block_table: [B, nb]; lengths: [B] encoder positions of each row
    -> [B, H, D], attending positions 0 .. length - 1 through the row's blocks (a row of length 0 gets zeros).
    ``k_scale``, ``v_scale``: as ``paged_decode_attention_reference``'s."""
    read_rows = (block_table[:, :, None] * block_size + torch.arange(block_size, device=q.device)).flatten(1)
    mask = (torch.arange(read_rows.shape[1], device=q.device)[None, :] < lengths[:, None])[:, None, None, :]
    keys = kv_format.gather(k_pool, k_scale, read_rows, block_size, q.dtype).transpose(1, 2)
    values = kv_format.gather(v_pool, v_scale, read_rows, block_size, q.dtype).transpose(1, 2)
    out = F.scaled_dot_product_attention(q[:, :, None], keys, values, attn_mask=mask)[:, :, 0]
    return torch.where((lengths > 0)[:, None, None], out, torch.zeros_like(out))


def _check_scales(k_pool: torch.Tensor, k_scale: torch.Tensor | None, v_scale: torch.Tensor | None,
                  block_size: int) -> bool:
    """Whether the pool is scaled; a scaled pool's scales must be dense [blocks, H, block_size]."""
    if k_scale is None:
        return False
    blocks, heads = k_pool.shape[0] // block_size, k_pool.shape[1]
    for scale in (k_scale, v_scale):
        if scale is None or tuple(scale.shape) != (blocks, heads, block_size) or not scale.is_contiguous():
            raise ValueError(f"an e4m3 pool's scales must be dense [{blocks}, {heads}, {block_size}]")
    return True


def paged_cross_attention(
    q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, block_table: torch.Tensor, lengths: torch.Tensor,
    block_size: int, k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None, *,
    block_n: int | None = None, num_warps: int | None = None, splits: int | None = None,
    heads_per_program: int | None = None,
) -> torch.Tensor:
    """``paged_cross_attention_reference`` in one kernel where ``supported`` (two when the positions are split).
    ``block_n`` (positions per tile), ``num_warps``, ``splits`` (programs per row and head group, each over a
    share of the positions, then combined) and ``heads_per_program`` (a power of two dividing H: the heads one
    program reads side by side, so each position is one contiguous read of that many heads) are the launch
    settings; ``scripts/bench_paged_attention.py --cross`` times them, and the defaults are what it found fastest
    on the H200."""
    if not supported(q):
        return paged_cross_attention_reference(q, k_pool, v_pool, block_table, lengths, block_size, k_scale, v_scale)
    b, h, d = q.shape
    if k_pool.stride(-1) != 1 or k_pool.stride(1) != d or v_pool.stride() != k_pool.stride():
        raise ValueError("the pool's layer must be [rows, H, D] with contiguous heads")
    scaled = _check_scales(k_pool, k_scale, v_scale, block_size)
    # Two heads of e4m3 (128-byte reads) were fastest on the H200 for large-v3 and tiny alike; four were slower.
    group = heads_per_program or _heads_per_program(h, d * k_pool.element_size())
    if group & (group - 1) or h % group:
        raise ValueError(f"heads_per_program must be a power of two dividing the {h} heads, got {group}")
    q, lengths = q.contiguous(), lengths.contiguous()
    if block_table.stride(1) != 1:
        block_table = block_table.contiguous()
    block_n = block_n or max(16, min(64, block_size))
    num_warps = num_warps or (1 if scaled else 2)
    # e4m3: about 8,192 programs of head groups (H200, two heads a program: 64 large-v3 rows 96 us at 8 splits,
    # 256 rows 312 us at 4, 64 tiny rows 38 us at 8).
    if splits is None:
        splits = min(8, triton.next_power_of_2(-(-8192 // max(1, b * h // group)))) if scaled else 1
    span = block_table.shape[1] * block_size
    split = -(-span // splits // block_n) * block_n  # positions per split, whole tiles
    splits = -(-span // split)  # a power of two or fewer: few kernel variants, whatever the batch
    out = torch.empty_like(q)
    part = torch.empty((b, h, splits, d + 2), dtype=torch.float32, device=q.device) if splits > 1 else out
    _paged_cross_attention_kernel[(b, h // group, splits)](
        q, k_pool, v_pool, k_scale if scaled else k_pool, v_scale if scaled else v_pool, block_table, lengths, out,
        part, block_table.stride(0), block_table.shape[1], k_pool.stride(0), d**-0.5, split, NUM_HEADS=h, HEAD_DIM=d,
        HEADS=group, BLOCK_SIZE=block_size, BLOCK_N=block_n, SCALED=scaled, NUM_SPLITS=splits, num_warps=num_warps,
    )
    if splits > 1:
        _combine_splits_kernel[(b, h)](part, out, NUM_HEADS=h, HEAD_DIM=d, NUM_SPLITS=splits,
                                       SPLITS_P2=triton.next_power_of_2(splits), num_warps=1)
    return out


def _heads_per_program(num_heads: int, head_bytes: int) -> int:
    """The fewest heads (a power of two dividing ``num_heads``) that make a position's read at least 128 bytes."""
    group = 1
    while group * head_bytes < 128 and num_heads % (2 * group) == 0:
        group *= 2
    return group


def supported(q: torch.Tensor) -> bool:
    """Whether the kernel runs for ``q`` (a power-of-two head size; the reference serves otherwise)."""
    return per_head_kernel_runs_on(q)


def paged_decode_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
    block_table: torch.Tensor, positions: torch.Tensor, block_size: int,
    k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """``paged_decode_attention_reference`` in one kernel where ``supported``."""
    if not supported(q):
        return paged_decode_attention_reference(q, k, v, k_pool, v_pool, block_table, positions, block_size,
                                                k_scale, v_scale)
    b, h, d = q.shape
    kv_heads = k.shape[1]
    if h % kv_heads or k_pool.shape[1] != kv_heads:
        raise ValueError(f"{h} query heads cannot share the pool's {k_pool.shape[1]} key/value heads "
                         f"(new keys have {kv_heads})")
    if k_pool.stride(-1) != 1 or k_pool.stride(1) != d or v_pool.stride() != k_pool.stride():
        raise ValueError("the pool's layer must be [rows, Hkv, D] with contiguous heads")
    scaled = _check_scales(k_pool, k_scale, v_scale, block_size)
    # The kernel indexes rows, positions and table entries densely: strided views (a prompt's expanded positions,
    # a table slice of the pool's) become dense first.
    q, k, v, positions = (t.contiguous() for t in (q, k, v, positions))
    if block_table.stride(1) != 1:
        block_table = block_table.contiguous()
    out = torch.empty_like(q)
    # Heads vary fastest in the launch order: the query heads that share a key/value head run side by side, so
    # the later ones of a group can find its keys and values in L2 (on the H200, Qwen3-ASR's 16 over 8 heads:
    # 347 ms -> 240 ms over 1,848 calls; L2 hits themselves were not measured).
    _paged_decode_attention_kernel[(h, b)](
        q, k, v, k_pool, v_pool, k_scale if scaled else k_pool, v_scale if scaled else v_pool, block_table,
        positions, out, block_table.stride(0), block_table.shape[1], k_pool.stride(0), d**-0.5,
        NUM_HEADS=h, NUM_KV_HEADS=kv_heads, HEAD_DIM=d, BLOCK_SIZE=block_size, BLOCK_N=max(16, min(64, 4096 // d)),
        SCALED=scaled,
        num_warps=1,  # one warp per (row, head), 4096 key values a tile: measured fastest on the H200 at D 64 and 128
    )
    return out


if triton is not None:

    @triton.jit
    def _attend_blocks(q, k_pool, v_pool, k_scale, v_scale, table, first, num_positions, head, pool_stride, best,
                       total, acc, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
                       NUM_KV_HEADS: tl.constexpr, SCALED: tl.constexpr):
        """One row's and (key/value) head's online softmax over positions [first, num_positions) of its block
        table, a tile of BLOCK_N at a time, read in place; carries (running maximum, weight total, weighted
        values). SCALED: the pool holds e4m3 values and scales [blocks, NUM_KV_HEADS, BLOCK_SIZE]
        (oasr.layers.kv_format); a key's scale multiplies its score and a value's its weight, once per position."""
        d = tl.arange(0, HEAD_DIM)
        for start in range(first, num_positions, BLOCK_N):
            n = start + tl.arange(0, BLOCK_N)
            live = n < num_positions
            block = tl.load(table + n // BLOCK_SIZE, mask=live, other=0).to(tl.int64)
            rows = (block * BLOCK_SIZE + n % BLOCK_SIZE) * pool_stride + head * HEAD_DIM
            keys = tl.load(k_pool + rows[:, None] + d[None, :], mask=live[:, None], other=0.0).to(tl.float32)
            scores = tl.sum(keys * q[None, :], axis=1)
            if SCALED:
                at = (block * NUM_KV_HEADS + head) * BLOCK_SIZE + n % BLOCK_SIZE
                scores = scores * tl.load(k_scale + at, mask=live, other=0.0)
            scores = tl.where(live, scores, float("-inf"))
            new_best = tl.maximum(best, tl.max(scores, axis=0))
            weights = tl.exp(scores - new_best)
            rescale = tl.exp(best - new_best)
            values = tl.load(v_pool + rows[:, None] + d[None, :], mask=live[:, None], other=0.0).to(tl.float32)
            weighted = weights
            if SCALED:
                weighted = weights * tl.load(v_scale + at, mask=live, other=0.0)
            acc = acc * rescale + tl.sum(weighted[:, None] * values, axis=0)
            total = total * rescale + tl.sum(weights, axis=0)
            best = new_best
        return best, total, acc

    @triton.jit
    def _head_scale(x):
        """One head's e4m3 scale, as ``oasr.engine.kv_format.quantize_heads`` computes it."""
        return tl.maximum(tl.max(tl.abs(x), axis=0), 1e-12) * (1.0 / 448.0)

    @triton.jit
    def _rounded(x, scale):
        # div_rn: the correctly rounded reciprocal torch computes (Triton's "/" is an approximate division).
        return tl.minimum(tl.maximum(x * tl.math.div_rn(1.0, scale), -448.0), 448.0).to(tl.float8e4nv)

    @triton.jit
    def _quantized(x):
        """x (float32, one head's values) as an e4m3 cache holds it, dequantized."""
        scale = _head_scale(x)
        return _rounded(x, scale).to(tl.float32) * scale

    @triton.jit
    def _store_scaled(pool, scales, dest, scale_at, x):
        """x (float32, one head's values) into an e4m3 pool at ``dest`` and its scale at ``scale_at``."""
        scale = _head_scale(x)
        tl.store(pool + dest, _rounded(x, scale))
        tl.store(scales + scale_at, scale)

    @triton.jit
    def _paged_decode_attention_kernel(
        q_ptr, k_ptr, v_ptr, k_pool, v_pool, k_scale, v_scale, table_ptr, positions_ptr, out_ptr,
        table_stride, num_blocks, pool_stride, scale,
        NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
        BLOCK_N: tl.constexpr, SCALED: tl.constexpr,
    ):
        head = tl.program_id(0)
        row = tl.program_id(1).to(tl.int64)
        group: tl.constexpr = NUM_HEADS // NUM_KV_HEADS
        kv_head = head // group
        d = tl.arange(0, HEAD_DIM)
        at = (row * NUM_HEADS + head) * HEAD_DIM + d
        kv_at = (row * NUM_KV_HEADS + kv_head) * HEAD_DIM + d
        q = tl.load(q_ptr + at).to(tl.float32) * scale
        k_new = tl.load(k_ptr + kv_at)
        v_new = tl.load(v_ptr + kv_at)
        position = tl.load(positions_ptr + row)
        table = table_ptr + row * table_stride
        # Store the new token where the table puts it (idle rows past their table write its last block), once
        # per key/value head: by the first query head of its group. No program reads that position from the pool.
        own = tl.load(table + tl.minimum(position // BLOCK_SIZE, num_blocks - 1)).to(tl.int64)
        dest = (own * BLOCK_SIZE + position % BLOCK_SIZE) * pool_stride + kv_head * HEAD_DIM + d
        if SCALED:
            # Every program of the group rounds the new token as the pool holds it; the first one stores it.
            scale_at = (own * NUM_KV_HEADS + kv_head) * BLOCK_SIZE + position % BLOCK_SIZE
            k_own = _quantized(k_new.to(tl.float32))
            v_own = _quantized(v_new.to(tl.float32))
            if head % group == 0:
                _store_scaled(k_pool, k_scale, dest, scale_at, k_new.to(tl.float32))
                _store_scaled(v_pool, v_scale, dest, scale_at, v_new.to(tl.float32))
        else:
            k_own = k_new.to(tl.float32)
            v_own = v_new.to(tl.float32)
            if head % group == 0:
                tl.store(k_pool + dest, k_new)
                tl.store(v_pool + dest, v_new)
        # The new token first: it is always attended, so the running maximum starts finite.
        best = tl.sum(q * k_own, axis=0)
        total = tl.full((), 1.0, tl.float32)
        acc = v_own
        # Then the cached positions before it, read in place through the table.
        cached = tl.minimum(position, num_blocks * BLOCK_SIZE)
        best, total, acc = _attend_blocks(q, k_pool, v_pool, k_scale, v_scale, table, 0, cached, kv_head,
                                          pool_stride, best, total, acc, HEAD_DIM, BLOCK_SIZE, BLOCK_N, NUM_KV_HEADS,
                                          SCALED)
        tl.store(out_ptr + at, (acc / total).to(out_ptr.dtype.element_ty))

    @triton.jit
    def _attend_head_group(q, k_pool, v_pool, k_scale, v_scale, table, first, num_positions, head0, pool_stride,
                           best, total, acc, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
                           NUM_HEADS: tl.constexpr, HEADS: tl.constexpr, SCALED: tl.constexpr):
        """``_attend_blocks`` for HEADS adjacent heads from ``head0`` at once: each position's keys (and values)
        of the group are one contiguous read. q, acc: [HEADS, HEAD_DIM]; best, total: [HEADS]."""
        g = tl.arange(0, HEADS)
        within = (head0 + g)[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]  # [HEADS, HEAD_DIM]
        for start in range(first, num_positions, BLOCK_N):
            n = start + tl.arange(0, BLOCK_N)
            live = n < num_positions
            block = tl.load(table + n // BLOCK_SIZE, mask=live, other=0).to(tl.int64)
            slot = n % BLOCK_SIZE
            at = ((block * BLOCK_SIZE + slot) * pool_stride)[:, None, None] + within[None, :, :]
            keys = tl.load(k_pool + at, mask=live[:, None, None], other=0.0).to(tl.float32)
            scores = tl.sum(keys * q[None, :, :], axis=2)  # [BLOCK_N, HEADS]
            if SCALED:
                scale_at = (block[:, None] * NUM_HEADS + head0 + g[None, :]) * BLOCK_SIZE + slot[:, None]
                scores = scores * tl.load(k_scale + scale_at, mask=live[:, None], other=0.0)
            scores = tl.where(live[:, None], scores, float("-inf"))
            new_best = tl.maximum(best, tl.max(scores, axis=0))
            weights = tl.exp(scores - new_best[None, :])
            rescale = tl.exp(best - new_best)
            values = tl.load(v_pool + at, mask=live[:, None, None], other=0.0).to(tl.float32)
            weighted = weights
            if SCALED:
                weighted = weights * tl.load(v_scale + scale_at, mask=live[:, None], other=0.0)
            acc = acc * rescale[:, None] + tl.sum(weighted[:, :, None] * values, axis=0)
            total = total * rescale + tl.sum(weights, axis=0)
            best = new_best
        return best, total, acc

    @triton.jit
    def _paged_cross_attention_kernel(
        q_ptr, k_pool, v_pool, k_scale, v_scale, table_ptr, lengths_ptr, out_ptr, part_ptr, table_stride,
        num_blocks, pool_stride, scale, split_size, NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
        HEADS: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, SCALED: tl.constexpr,
        NUM_SPLITS: tl.constexpr,
    ):
        """Program (row, head group, split): heads [group * HEADS, (group + 1) * HEADS) over positions
        [split * split_size, (split + 1) * split_size) of the row. One split writes the output; several write
        their (maximum, total, weighted values) per head to ``part_ptr`` for ``_combine_splits_kernel``."""
        row = tl.program_id(0).to(tl.int64)
        head0 = tl.program_id(1) * HEADS
        split = tl.program_id(2)
        g = tl.arange(0, HEADS)
        d = tl.arange(0, HEAD_DIM)
        at = ((row * NUM_HEADS + head0 + g) * HEAD_DIM)[:, None] + d[None, :]  # [HEADS, HEAD_DIM]
        q = tl.load(q_ptr + at).to(tl.float32) * scale
        table = table_ptr + row * table_stride
        length = tl.minimum(tl.load(lengths_ptr + row), num_blocks * BLOCK_SIZE)
        # A finite start: a row of length 0 (an idle slot) ends with zero weight and writes zeros.
        best = tl.full((HEADS,), -1.0e30, tl.float32)
        total = tl.zeros((HEADS,), tl.float32)
        acc = tl.zeros((HEADS, HEAD_DIM), tl.float32)
        first = split * split_size
        last = tl.minimum(length, first + split_size)
        best, total, acc = _attend_head_group(q, k_pool, v_pool, k_scale, v_scale, table, first, last, head0,
                                              pool_stride, best, total, acc, HEAD_DIM, BLOCK_SIZE, BLOCK_N,
                                              NUM_HEADS, HEADS, SCALED)
        if NUM_SPLITS == 1:
            tl.store(out_ptr + at, (acc / tl.maximum(total, 1.0e-30)[:, None]).to(out_ptr.dtype.element_ty))
        else:
            part = (((row * NUM_HEADS + head0 + g) * NUM_SPLITS + split) * (HEAD_DIM + 2))
            tl.store(part_ptr + part[:, None] + d[None, :], acc)
            tl.store(part_ptr + part + HEAD_DIM, best)
            tl.store(part_ptr + part + HEAD_DIM + 1, total)

    @triton.jit
    def _combine_splits_kernel(part_ptr, out_ptr, NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                               NUM_SPLITS: tl.constexpr, SPLITS_P2: tl.constexpr):
        """Program (row, head): the splits' partial softmaxes rescaled to their common maximum and summed."""
        row = tl.program_id(0).to(tl.int64)
        head = tl.program_id(1)
        d = tl.arange(0, HEAD_DIM)
        splits = tl.arange(0, SPLITS_P2)
        live = splits < NUM_SPLITS
        part = ((row * NUM_HEADS + head) * NUM_SPLITS + splits) * (HEAD_DIM + 2)
        best = tl.load(part_ptr + part + HEAD_DIM, mask=live, other=-1.0e30)
        total = tl.load(part_ptr + part + HEAD_DIM + 1, mask=live, other=0.0)
        acc = tl.load(part_ptr + part[:, None] + d[None, :], mask=live[:, None], other=0.0)
        weight = tl.exp(best - tl.max(best, axis=0))
        out = tl.sum(weight[:, None] * acc, axis=0) / tl.maximum(tl.sum(weight * total, axis=0), 1.0e-30)
        tl.store(out_ptr + (row * NUM_HEADS + head) * HEAD_DIM + d, out.to(out_ptr.dtype.element_ty))
