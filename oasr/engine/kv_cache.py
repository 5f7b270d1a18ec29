"""Device memory for decoding: the paged self-attention pool (cross-attention K/V: ``oasr.engine.cross_cache``).

Pool layout: ``k[layer]`` is [num_blocks * block_size, heads, head_dim]; position p of a request whose block
table is ``t`` lives at row ``t[p // block_size] * block_size + p % block_size``. Block 0 is the null block:
idle decode rows point there so their (discarded) writes touch nothing live. An e4m3 pool (``kv_cache_dtype``
fp8) also has ``k_scale[layer]`` and ``v_scale[layer]``, [num_blocks, heads, block_size] (``oasr.layers.kv_format``).
"""

from __future__ import annotations

import torch

from oasr.kernels import paged_attention
from oasr.engine.memory import kv_zeros
from oasr.layers import kv_format
from oasr.layers.attention import sdpa
from oasr.layers.kv_format import KVFormat, as_format
from oasr.models.base import DecoderSpec


class PagedKVPool:
    def __init__(self, spec: DecoderSpec, num_blocks: int, block_size: int, fmt: KVFormat | torch.dtype,
                 device: torch.device):
        """``fmt``: how K/V are held (a bare dtype: in that dtype, unscaled)."""
        self.format = as_format(fmt)
        self.block_size = block_size
        self.num_blocks = num_blocks
        shape = (spec.num_layers, num_blocks, block_size, spec.num_kv_heads, spec.head_dim)
        self.k, self.k_scale = kv_zeros(self.format, *shape, device)
        self.v, self.v_scale = kv_zeros(self.format, *shape, device)
        self.offsets = torch.arange(block_size, device=device)

    def rows(self, block_table: torch.Tensor) -> torch.Tensor:
        """block_table: [B, nb] -> pool rows of positions 0 .. nb * block_size - 1 of each request: [B, nb * bs]."""
        return (block_table[:, :, None] * self.block_size + self.offsets).flatten(1)

    def copy_blocks(self, source_table: torch.Tensor, target_table: torch.Tensor) -> None:
        """Every position of ``source_table``'s blocks into the same position of ``target_table``'s, for K and V of
        every layer; both [N, nb]. All sources are read before any target is written, so a row may be a target
        and another row's source at once (beam search reorders its beams this way). Null-block entries of
        shorter rows copy the null block onto itself."""
        sources = self.rows(source_table).flatten()
        targets = self.rows(target_table).flatten()
        kv_format.copy_rows(self.k, self.k_scale, sources, targets, self.block_size)
        kv_format.copy_rows(self.v, self.v_scale, sources, targets, self.block_size)

    def layer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """One layer's (k, v, k_scale, v_scale); the scales are None unless the pool holds e4m3 values."""
        scales = (None, None) if self.k_scale is None else (self.k_scale[layer], self.v_scale[layer])
        return self.k[layer], self.v[layer], *scales


class PagedContext:
    """One forward's view of the pool: where the new tokens' K/V go, and which positions each query sees.

    block_table: [B, nb]; positions: [B, T] of the new tokens; write_rows: [B * T] pool rows for them (row-major
    over B then T); read_rows: [B, L] pool rows of the positions to attend; mask: bool [B, 1, T, L].
    ``decode_kernel``: a one-token step may attend with the paged kernel (when the layer asks for kernels).
    ``from_start``: the new tokens are every row's positions 0 .. T-1 (a prompt run from the start, right-padded):
    they are stored, then attend to one another causally from the new K/V instead of reading the pool back, which
    lets SDPA take its flash kernel (no mask). A padded row's tail attends to its padding, as its discarded
    outputs may; its real positions never see a later one.
    """

    def __init__(self, pool: PagedKVPool, block_table: torch.Tensor, positions: torch.Tensor,
                 write_rows: torch.Tensor, read_rows: torch.Tensor, mask: torch.Tensor, decode_kernel: bool = False,
                 from_start: bool = False):
        self.pool = pool
        self.decode_kernel = decode_kernel
        self.from_start = from_start
        self.block_table = block_table
        self.positions = positions
        self.write_rows = write_rows
        self.read_rows = read_rows
        self.mask = mask

    def attend(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, use_kernel: bool = False
    ) -> torch.Tensor:
        k_pool, v_pool, k_scale, v_scale = self.pool.layer(layer)
        size = self.pool.block_size
        # A decode step: one kernel stores the new token and reads the blocks in place.
        if use_kernel and self.decode_kernel and q.shape[2] == 1 and paged_attention.supported(q):
            out = paged_attention.paged_decode_attention(
                q[:, :, 0], k[:, :, 0], v[:, :, 0], k_pool, v_pool, self.block_table, self.positions[:, 0], size,
                k_scale, v_scale,
            )
            return out[:, :, None]
        b, h, t, d = k.shape
        kv_format.store(k_pool, k_scale, self.write_rows, k.transpose(1, 2).reshape(b * t, h, d), size)
        kv_format.store(v_pool, v_scale, self.write_rows, v.transpose(1, 2).reshape(b * t, h, d), size)
        if self.from_start:  # the prompt attends to its own keys and values as computed, not as stored
            return sdpa(q, k, v, is_causal=True)
        keys = kv_format.gather(k_pool, k_scale, self.read_rows, size, q.dtype).transpose(1, 2)
        values = kv_format.gather(v_pool, v_scale, self.read_rows, size, q.dtype).transpose(1, 2)
        return sdpa(q, keys, values, mask=self.mask)


def paged_context(
    pool: PagedKVPool, block_table: torch.Tensor, positions: torch.Tensor, *, decode_kernel: bool = False,
    from_start: bool = False,
) -> PagedContext:
    """block_table: [B, nb]; positions: [B, T] of the new tokens (consecutive per row; with ``from_start``, 0 .. T-1
    in every row). Each query attends to every cached position up to and including its own."""
    read_rows = pool.rows(block_table)
    # Live rows always have a block for their position; idle rows (null table) may run past the table.
    block = block_table.gather(1, (positions // pool.block_size).clamp(max=block_table.shape[1] - 1))
    write_rows = (block * pool.block_size + positions % pool.block_size).reshape(-1)
    span = torch.arange(read_rows.shape[1], device=positions.device)
    mask = (span[None, None, :] <= positions[:, :, None])[:, None]
    return PagedContext(pool, block_table, positions, write_rows, read_rows, mask, decode_kernel, from_start)
