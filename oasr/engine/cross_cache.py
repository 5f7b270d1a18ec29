"""Where the engine keeps each request's cross-attention K/V, and how a step's rows read it.

A model's ``CrossSpec`` decides the layout:

- fixed length (Whisper: every request is a padded 30 s window, 1,500 encoder positions): one buffer of
  [layers, slot, positions, heads * head_dim] per K and V; an encode batch in consecutive slots is projected
  straight into place and decode steps read the slots as they are (``SlotCrossStore``);
- variable length (Canary, Cohere: a 4 s clip has 50 encoder positions, a 40 s one 500): a pool of fixed-size
  blocks, each request holding the blocks its own length needs (the scheduler hands them out with its slots);
  decode steps read the blocks in place with ``oasr.kernels.paged_attention.paged_cross_attention``, prompts
  through a gather (``PagedCrossStore``). A beam request's slots share one set of blocks.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from oasr.engine.memory import cache_zeros
from oasr.engine.step import EncodeRow
from oasr.uploads import upload
from oasr.kernels import paged_attention
from oasr.layers.attention import sdpa
from oasr.models.base import DecoderSpec


def _as_words(t: torch.Tensor) -> torch.Tensor:
    """[L, N, ...] contiguous -> [L, N, words]: the same bytes as the widest integers that tile each [L, n] row."""
    flat = t.flatten(2)
    for dtype in (torch.int64, torch.int32):
        if flat.shape[-1] * t.element_size() % dtype.itemsize == 0:
            return flat.view(dtype)
    return flat


class NoCrossStore:
    """A decoder without cross-attention (``PromptAudio``: the audio is in its prompt): nothing is kept per request,
    and its steps get no cross-attention cache (None)."""

    def context(self, batch: int) -> None:
        return None

    def release(self, slots: Sequence[int]) -> None:
        pass

    def write(self, model, rows: tuple[EncodeRow, ...], hidden: torch.Tensor, lengths: Sequence[int]) -> None:
        return None


class SlotCross:
    """A step's view of slot-held cross K/V: each [layers, B, H, S, D] views of the slot buffers."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k = k
        self.v = v

    def attend(self, layer: int, q: torch.Tensor, *, use_kernel: bool = False) -> torch.Tensor:
        return sdpa(q, self.k[layer], self.v[layer])

    def keys(self, layer: int) -> torch.Tensor:
        return self.k[layer]


class SlotCrossStore:
    """Fixed-length cross K/V, one row of every layer per slot."""

    def __init__(self, spec: DecoderSpec, num_slots: int, dtype: torch.dtype, device: torch.device) -> None:
        self.spec = spec
        self.device = device
        width = spec.num_kv_heads * spec.head_dim
        shape = (spec.num_layers, num_slots, spec.cross.max_len, width)
        self.k = cache_zeros(shape, dtype, device)
        self.v = cache_zeros(shape, dtype, device)

    @staticmethod
    def bytes_per_slot(spec: DecoderSpec, dtype: torch.dtype) -> int:
        return 2 * spec.num_layers * spec.cross.max_len * spec.num_kv_heads * spec.head_dim * dtype.itemsize

    def _split(self, cross: torch.Tensor) -> torch.Tensor:
        """[layers, B, S, H * D] -> the [layers, B, H, S, D] view attention reads (heads stay interleaved)."""
        return cross.unflatten(-1, (self.spec.num_kv_heads, self.spec.head_dim)).transpose(2, 3)

    def context(self, batch: int) -> SlotCross:
        """Slots [0, batch) as a decode step reads them."""
        return SlotCross(self._split(self.k[:, :batch]), self._split(self.v[:, :batch]))

    def release(self, slots: Sequence[int]) -> None:
        pass  # a slot's K/V is overwritten by its next request

    def write(self, model, rows: tuple[EncodeRow, ...], hidden: torch.Tensor, lengths: Sequence[int]) -> SlotCross:
        """Projects every row's K/V (all ``max_len`` positions: ``lengths`` is not read) into each slot it holds;
        returns the batch's K/V as the prompts read it.
        Rows of one slot each in consecutive slots (every batch of a fresh engine, and most in steady state:
        slots are handed out lowest first) are projected straight into the slots; others through a scratch
        buffer and one copy."""
        first = [row.slots[0] for row in rows]
        if all(len(row.slots) == 1 for row in rows) and first == list(range(first[0], first[0] + len(rows))):
            span = slice(first[0], first[0] + len(rows))
            k, v = self.k[:, span], self.v[:, span]
            model.cross_kv_into(hidden, k, v)
        else:
            k = torch.empty((self.k.shape[0], len(rows), *self.k.shape[2:]), dtype=self.k.dtype, device=self.device)
            v = torch.empty_like(k)
            model.cross_kv_into(hidden, k, v)
            self._store(rows, k, v)
        return SlotCross(self._split(k), self._split(v))

    def _store(self, rows: tuple[EncodeRow, ...], k: torch.Tensor, v: torch.Tensor) -> None:
        """Each row's K/V ([layers, B, S, width]) into every slot it holds: a request's beams all attend to the
        same audio. Copied as 8-byte words: an index copy runs per element."""
        for beam in range(max(len(row.slots) for row in rows)):
            have = [i for i, row in enumerate(rows) if len(row.slots) > beam]
            slots, index = upload(self.device, [rows[i].slots[beam] for i in have], have)
            kb, vb = k, v
            if len(have) < len(rows):
                kb, vb = k.index_select(1, index), v.index_select(1, index)
            _as_words(self.k).index_copy_(1, slots, _as_words(kb))
            _as_words(self.v).index_copy_(1, slots, _as_words(vb))


class PagedCross:
    """A step's view of paged cross K/V: the pool, each row's block table [B, nb] and length [B]."""

    def __init__(self, k_pool: torch.Tensor, v_pool: torch.Tensor, table: torch.Tensor, lengths: torch.Tensor,
                 block_size: int) -> None:
        self.k_pool = k_pool  # [layers, rows, H, D]
        self.v_pool = v_pool
        self.table = table
        self.lengths = lengths
        self.block_size = block_size

    def _rows(self) -> torch.Tensor:
        offsets = torch.arange(self.block_size, device=self.table.device)
        return (self.table[:, :, None] * self.block_size + offsets).flatten(1)  # [B, nb * bs]

    def _mask(self, span: int) -> torch.Tensor:
        positions = torch.arange(span, device=self.table.device)
        return (positions[None, :] < self.lengths[:, None])[:, None, None, :]

    def attend(self, layer: int, q: torch.Tensor, *, use_kernel: bool = False) -> torch.Tensor:
        if use_kernel and q.shape[2] == 1 and paged_attention.supported(q):
            out = paged_attention.paged_cross_attention(q[:, :, 0], self.k_pool[layer], self.v_pool[layer],
                                                        self.table, self.lengths, self.block_size)
            return out[:, :, None]
        rows = self._rows()
        keys = self.k_pool[layer][rows].transpose(1, 2)  # [B, H, L, D]
        values = self.v_pool[layer][rows].transpose(1, 2)
        return sdpa(q, keys, values, mask=self._mask(rows.shape[1]))

    def keys(self, layer: int) -> torch.Tensor:
        return self.k_pool[layer][self._rows()].transpose(1, 2)


class PagedCrossStore:
    """Variable-length cross K/V in blocks of ``block_size`` encoder positions; block 0 is the null block that
    idle slots point at (their length is 0, so nothing of it is attended)."""

    def __init__(self, spec: DecoderSpec, num_blocks: int, block_size: int, num_slots: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        self.spec = spec
        self.block_size = block_size
        self.device = device
        rows = num_blocks * block_size
        shape = (spec.num_layers, rows, spec.num_kv_heads, spec.head_dim)
        self.k = cache_zeros(shape, dtype, device)
        self.v = cache_zeros(shape, dtype, device)
        self.max_blocks = -(-spec.cross.max_len // block_size)
        self.table = torch.zeros(num_slots, self.max_blocks, dtype=torch.long, device=device)
        self.lengths = torch.zeros(num_slots, dtype=torch.long, device=device)

    @staticmethod
    def bytes_per_block(spec: DecoderSpec, block_size: int, dtype: torch.dtype) -> int:
        return 2 * spec.num_layers * block_size * spec.num_kv_heads * spec.head_dim * dtype.itemsize

    def context(self, batch: int, slots: torch.Tensor | None = None) -> PagedCross:
        """Slots [0, batch) (or the given ``slots``) as a step reads them."""
        table = self.table[:batch] if slots is None else self.table[slots]
        lengths = self.lengths[:batch] if slots is None else self.lengths[slots]
        return PagedCross(self.k, self.v, table, lengths, self.block_size)

    def release(self, slots: Sequence[int]) -> None:
        (index,) = upload(self.device, list(slots))
        self.table.index_fill_(0, index, 0)
        self.lengths.index_fill_(0, index, 0)

    def write(self, model, rows: tuple[EncodeRow, ...], hidden: torch.Tensor, lengths: Sequence[int]) -> PagedCross:
        """Projects the K/V of each row's first ``lengths[i]`` positions (``hidden``: [B, S, E]) and stores them in
        the row's blocks; every slot of a row points at them. Returns the rows' first slots' view.

        The indices are built on the host from the scheduler's block ids and the requests' known lengths, and go
        up in one asynchronous copy, so the walk never waits for the encoder; only real positions are projected."""
        b, s = hidden.shape[:2]
        spec, size = self.spec, self.block_size
        sources, targets = [], []
        table = np.zeros((b, self.max_blocks), dtype=np.int64)
        for i, (row, n) in enumerate(zip(rows, lengths, strict=True)):
            positions = np.arange(n)
            blocks = np.asarray(row.cross_block_ids, dtype=np.int64)
            table[i, : len(blocks)] = blocks
            sources.append(i * s + positions)
            targets.append(blocks[positions // size] * size + positions % size)
        slots = [slot for row in rows for slot in row.slots]
        owner = [i for i, row in enumerate(rows) for _ in row.slots]
        source, target, flat_table, lengths_, slots_, owner_ = upload(
            self.device, np.concatenate(sources), np.concatenate(targets), table, lengths, slots, owner)
        table_ = flat_table.view(b, self.max_blocks)
        packed = hidden.flatten(0, 1).index_select(0, source)[None]  # [1, N, E]: the real positions
        width = spec.num_kv_heads * spec.head_dim
        k = torch.empty((spec.num_layers, 1, packed.shape[1], width), dtype=self.k.dtype, device=self.device)
        v = torch.empty_like(k)
        model.cross_kv_into(packed, k, v)
        for store, new in ((self.k, k), (self.v, v)):
            store.index_copy_(1, target, new.view(spec.num_layers, -1, spec.num_kv_heads, spec.head_dim))
        self.table.index_copy_(0, slots_, table_[owner_])
        self.lengths.index_copy_(0, slots_, lengths_[owner_])
        return PagedCross(self.k, self.v, table_, lengths_, self.block_size)
