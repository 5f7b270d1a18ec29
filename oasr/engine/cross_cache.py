"""Where the engine keeps each request's cross-attention K/V, and how a step's rows read it.

A model's ``CrossSpec`` decides the layout:

- fixed length (Whisper: every request is a padded 30 s window, 1,500 encoder positions): one buffer of
  [layers, slot, positions, heads * head_dim] per K and V; an encode batch in consecutive slots is projected
  straight into place and decode steps read the slots as they are (``SlotCrossStore``);
- variable length (Canary, Cohere: a 4 s clip has 50 encoder positions, a 40 s one 500): a pool of fixed-size
  blocks, each request holding the blocks its own length needs (the scheduler hands them out with its slots);
  decode steps read the blocks in place with ``oasr.kernels.paged_attention.paged_cross_attention``, prompts
  through a gather (``PagedCrossStore``). A beam request's slots share one set of blocks.

Either may hold e4m3 values with a scale per position and head (``kv_cache_dtype`` fp8, ``oasr.layers.kv_format``):
a fixed-window slot is then read as one block of the window's length through the same paged kernel.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from oasr.engine.memory import kv_zeros
from oasr.engine.step import EncodeRow
from oasr.uploads import upload
from oasr.kernels import paged_attention
from oasr.layers import kv_format
from oasr.layers.attention import sdpa
from oasr.layers.kv_format import KVFormat, as_format
from oasr.models.base import DecoderSpec


def _as_words(t: torch.Tensor) -> torch.Tensor:
    """[L, N, ...] contiguous -> [L, N, words]: the same bytes as the widest integers that tile each [L, n] row."""
    flat = t.flatten(2)
    for dtype in (torch.int64, torch.int32):
        if flat.shape[-1] * t.element_size() % dtype.itemsize == 0:
            return flat.view(dtype)
    return flat


def _slots_and_owners(rows: tuple[EncodeRow, ...]) -> tuple[list[int], list[int]]:
    """Every slot the rows hold (a beam request holds several), and the index of the row that holds each."""
    return [slot for row in rows for slot in row.slots], [i for i, row in enumerate(rows) for _ in row.slots]


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
    """A step's view of slot-held cross K/V: each [layers, B, H, S, D] views of the slot buffers. ``paged``, where
    given, is the same slots as the paged kernel reads them with each idle slot's length 0: a one-query step on
    the kernel reads only the live slots' K/V (a step's batch spans every slot below its highest live one)."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor, paged: PagedCross | None = None) -> None:
        self.k = k
        self.v = v
        self.paged = paged

    def attend(self, layer: int, q: torch.Tensor, *, use_kernel: bool = False) -> torch.Tensor:
        if self.paged is not None and use_kernel and q.shape[2] == 1 and paged_attention.supported(q):
            return self.paged.attend(layer, q, use_kernel=True)
        return sdpa(q, self.k[layer], self.v[layer])

    def keys(self, layer: int) -> torch.Tensor:
        return self.k[layer]


class SlotCrossStore:
    """Fixed-length cross K/V, one row of every layer per slot.

    Held as the model's dtype, a step reads the slots as they are, with SDPA; a step whose rows times heads reach
    ``kernel_min_head_rows`` reads them with the paged kernel instead, which skips the slots no request holds (the
    kernel runs a program per row and head: fewer leave the GPU idle). Held in e4m3
    (``fmt.scaled``), each slot is one block of the window's length, and steps read it as a paged cross-attention
    pool whose tables name each row's own slot (``PagedCross``: the kernel scales the values as it reads them).

    Why from 1,280 (H100, ``scripts/bench_paged_attention.py --cross --fp16``, 1,500 positions, one layer): at
    large-v3's 20 heads, 4 rows take 24 us on SDPA and 64-112 us on the kernel; 64 rows with every slot live 185
    us on SDPA and 195 us on the kernel, with half of them idle 123-140 us on the kernel; 256 rows with half idle
    430 us on the kernel (SDPA reads all 256). At tiny's 6 heads, 64 rows take 66 us on SDPA and 122 us on the
    kernel. A step's batch spans every slot below its highest live one, so in a batch of long-form windows most
    slots go idle one by one while the longest window decodes."""

    KERNEL_MIN_HEAD_ROWS = 1280  # 64 rows of large-v3's 20 heads

    def __init__(self, spec: DecoderSpec, num_slots: int, fmt: KVFormat | torch.dtype, device: torch.device,
                 kernel_min_head_rows: int = KERNEL_MIN_HEAD_ROWS) -> None:
        self.spec = spec
        self.kernel_min_head_rows = kernel_min_head_rows
        self.device = device
        self.format = as_format(fmt)
        self.window = spec.cross.max_len
        shape = (spec.num_layers, num_slots, self.window, spec.num_kv_heads, spec.head_dim)
        self.k, self.k_scale = kv_zeros(self.format, *shape, device)  # [layers, slots * window, H, D]
        self.v, self.v_scale = kv_zeros(self.format, *shape, device)
        self._own_slot = torch.arange(num_slots, device=device)[:, None]  # each row's table: its slot
        self._full = torch.full((num_slots,), self.window, dtype=torch.long, device=device)
        self._live = torch.zeros(num_slots, dtype=torch.long, device=device)  # the window where a request holds it

    def _windows(self, cache: torch.Tensor) -> torch.Tensor:
        """[layers, slots * window, H, D] -> [layers, slots, window, H * D] (the same bytes)."""
        return cache.view(cache.shape[0], -1, self.window, cache.shape[2] * cache.shape[3])

    def _split(self, cross: torch.Tensor) -> torch.Tensor:
        """[layers, B, S, H * D] -> the [layers, B, H, S, D] view attention reads (heads stay interleaved)."""
        return cross.unflatten(-1, (self.spec.num_kv_heads, self.spec.head_dim)).transpose(2, 3)

    def _paged(self, table: torch.Tensor, lengths: torch.Tensor) -> PagedCross:
        return PagedCross(self.k, self.v, table, lengths, self.window, self.k_scale, self.v_scale,
                          self.format.compute_dtype)

    def context(self, batch: int) -> SlotCross | PagedCross:
        """Slots [0, batch) as a decode step reads them; the kernel skips the idle ones."""
        paged = self._paged(self._own_slot[:batch], self._live[:batch])
        if self.format.scaled:
            return paged
        return SlotCross(self._split(self._windows(self.k)[:, :batch]), self._split(self._windows(self.v)[:, :batch]),
                         paged if batch * self.spec.num_kv_heads >= self.kernel_min_head_rows else None)

    def release(self, slots: Sequence[int]) -> None:
        """The slots' K/V stays until their next request overwrites it; steps stop reading it now."""
        (index,) = upload(self.device, list(slots))
        self._live.index_fill_(0, index, 0)

    def _hold(self, rows: tuple[EncodeRow, ...]) -> None:
        (index,) = upload(self.device, _slots_and_owners(rows)[0])
        self._live.index_fill_(0, index, self.window)

    def write(self, model, rows: tuple[EncodeRow, ...], hidden: torch.Tensor, lengths: Sequence[int]
              ) -> SlotCross | PagedCross:
        """Projects every row's K/V (all ``max_len`` positions: ``lengths`` is not read) into each slot it holds;
        returns the batch's K/V as the prompts read it.
        Rows of one slot each in consecutive slots (every batch of a fresh engine, and most in steady state:
        slots are handed out lowest first) are projected straight into the slots; others through a scratch
        buffer and one copy. In e4m3, each layer's projection is rounded into every slot of its row."""
        self._hold(rows)
        if self.format.scaled:
            return self._write_scaled(model, rows, hidden)
        first = [row.slots[0] for row in rows]
        keys, values = self._windows(self.k), self._windows(self.v)
        if all(len(row.slots) == 1 for row in rows) and first == list(range(first[0], first[0] + len(rows))):
            span = slice(first[0], first[0] + len(rows))
            k, v = keys[:, span], values[:, span]
            model.cross_kv_into(hidden, k, v)
        else:
            k = torch.empty((keys.shape[0], len(rows), *keys.shape[2:]), dtype=keys.dtype, device=self.device)
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
            _as_words(self._windows(self.k)).index_copy_(1, slots, _as_words(kb))
            _as_words(self._windows(self.v)).index_copy_(1, slots, _as_words(vb))

    def _write_scaled(self, model, rows: tuple[EncodeRow, ...], hidden: torch.Tensor) -> PagedCross:
        """Each layer's projection rounded into e4m3 at every slot of its row, as it comes (no layer's K/V is held
        in full precision for the whole batch)."""
        slots, owner = _slots_and_owners(rows)
        slot_index, owner_index, first = upload(self.device, slots, owner, [row.slots[0] for row in rows])
        targets = (slot_index[:, None] * self.window + torch.arange(self.window, device=self.device)).flatten()
        heads, dim = self.spec.num_kv_heads, self.spec.head_dim

        def sink(data: torch.Tensor, scale: torch.Tensor, layer: int) -> Callable[[torch.Tensor], None]:
            def put(projected: torch.Tensor) -> None:  # [B * window, H * D] of one layer
                values = projected.view(len(rows), self.window, heads, dim)
                if len(slots) > len(rows):  # a beam request's slots all hold its K/V
                    values = values[owner_index]
                kv_format.store(data[layer], scale[layer], targets, values.flatten(0, 1), self.window)
            return put

        layers = range(self.spec.num_layers)
        model.cross_kv_into(hidden, [sink(self.k, self.k_scale, i) for i in layers],
                            [sink(self.v, self.v_scale, i) for i in layers])
        return self._paged(first[:, None], self._full[: len(rows)])


class PagedCross:
    """A step's view of paged cross K/V: the pool, each row's block table [B, nb] and length [B]."""

    def __init__(self, k_pool: torch.Tensor, v_pool: torch.Tensor, table: torch.Tensor, lengths: torch.Tensor,
                 block_size: int, k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
                 dtype: torch.dtype | None = None) -> None:
        """``dtype``: what an e4m3 pool's values are read as (the model's dtype)."""
        self.k_pool = k_pool  # [layers, rows, H, D]
        self.v_pool = v_pool
        self.k_scale = k_scale  # [layers, blocks, H, block_size] where the pool holds e4m3 values
        self.v_scale = v_scale
        self.table = table
        self.lengths = lengths
        self.block_size = block_size
        self.dtype = dtype or k_pool.dtype

    def _scales(self, layer: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        return (None, None) if self.k_scale is None else (self.k_scale[layer], self.v_scale[layer])

    def _rows(self) -> torch.Tensor:
        offsets = torch.arange(self.block_size, device=self.table.device)
        return (self.table[:, :, None] * self.block_size + offsets).flatten(1)  # [B, nb * bs]

    def _mask(self, span: int) -> torch.Tensor:
        positions = torch.arange(span, device=self.table.device)
        return (positions[None, :] < self.lengths[:, None])[:, None, None, :]

    def attend(self, layer: int, q: torch.Tensor, *, use_kernel: bool = False) -> torch.Tensor:
        k_scale, v_scale = self._scales(layer)
        b, h, t, d = q.shape
        # One query per row in the kernel; a prompt's queries too where the pool is e4m3, as rows of their own
        # (the alternative dequantizes every position the batch attends to).
        if use_kernel and (t == 1 or k_scale is not None) and paged_attention.supported(q):
            flat = q.transpose(1, 2).reshape(b * t, h, d)
            table, lengths = self.table, self.lengths
            if t > 1:
                table, lengths = table.repeat_interleave(t, 0), lengths.repeat_interleave(t, 0)
            out = paged_attention.paged_cross_attention(flat, self.k_pool[layer], self.v_pool[layer], table,
                                                        lengths, self.block_size, k_scale, v_scale)
            return out.view(b, t, h, d).transpose(1, 2)
        rows = self._rows()
        keys = kv_format.gather(self.k_pool[layer], k_scale, rows, self.block_size, q.dtype).transpose(1, 2)
        values = kv_format.gather(self.v_pool[layer], v_scale, rows, self.block_size, q.dtype).transpose(1, 2)
        out = sdpa(q, keys, values, mask=self._mask(rows.shape[1]))  # keys, values: [B, H, L, D]
        # A row of length 0 (an idle slot) is all masked: zeros, as the kernel gives, where some SDPA backends give
        # NaN (which the idle row's self-attention writes would carry into the null block live rows read masked).
        return torch.where((self.lengths > 0)[:, None, None, None], out, torch.zeros_like(out))

    def keys(self, layer: int) -> torch.Tensor:
        k_scale, _ = self._scales(layer)
        return kv_format.gather(self.k_pool[layer], k_scale, self._rows(), self.block_size, self.dtype).transpose(1, 2)


class PagedCrossStore:
    """Variable-length cross K/V in blocks of ``block_size`` encoder positions; block 0 is the null block that
    idle slots point at (their length is 0, so nothing of it is attended)."""

    def __init__(self, spec: DecoderSpec, num_blocks: int, block_size: int, num_slots: int,
                 fmt: KVFormat | torch.dtype, device: torch.device) -> None:
        self.spec = spec
        self.block_size = block_size
        self.device = device
        self.format = as_format(fmt)
        shape = (spec.num_layers, num_blocks, block_size, spec.num_kv_heads, spec.head_dim)
        self.k, self.k_scale = kv_zeros(self.format, *shape, device)
        self.v, self.v_scale = kv_zeros(self.format, *shape, device)
        self.max_blocks = -(-spec.cross.max_len // block_size)
        self.table = torch.zeros(num_slots, self.max_blocks, dtype=torch.long, device=device)
        self.lengths = torch.zeros(num_slots, dtype=torch.long, device=device)

    def _view(self, table: torch.Tensor, lengths: torch.Tensor) -> PagedCross:
        return PagedCross(self.k, self.v, table, lengths, self.block_size, self.k_scale, self.v_scale,
                          self.format.compute_dtype)

    def context(self, batch: int, slots: torch.Tensor | None = None) -> PagedCross:
        """Slots [0, batch) (or the given ``slots``) as a step reads them."""
        table = self.table[:batch] if slots is None else self.table[slots]
        lengths = self.lengths[:batch] if slots is None else self.lengths[slots]
        return self._view(table, lengths)

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
        slots, owner = _slots_and_owners(rows)
        source, target, flat_table, lengths_, slots_, owner_ = upload(
            self.device, np.concatenate(sources), np.concatenate(targets), table, lengths, slots, owner)
        table_ = flat_table.view(b, self.max_blocks)
        packed = hidden.flatten(0, 1).index_select(0, source)[None]  # [1, N, E]: the real positions
        width = spec.num_kv_heads * spec.head_dim
        k = torch.empty((spec.num_layers, 1, packed.shape[1], width), dtype=hidden.dtype, device=self.device)
        v = torch.empty_like(k)
        model.cross_kv_into(packed, k, v)
        for data, scale, new in ((self.k, self.k_scale, k), (self.v, self.v_scale, v)):
            kv_format.store(data, scale, target, new.view(spec.num_layers, -1, spec.num_kv_heads, spec.head_dim), size)
        self.table.index_copy_(0, slots_, table_[owner_])
        self.lengths.index_copy_(0, slots_, lengths_[owner_])
        return self._view(table_, lengths_)
