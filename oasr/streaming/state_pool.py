"""Per-stream state in slots: one tensor per declared field, [num_slots, *field.shape], allocated once.

A step gathers the rows of its streams' slots, the model computes their new state, and the step scatters it
back; nothing is allocated per stream. A slot is zeroed when a stream takes it, so a stream never sees the
state of the one before it.

A ring field (``StateField.ring``) is not gathered whole: it holds a stream's latest frames (an attention cache,
[layers, ..., frames, width]), of which a step reads each layer's once, in order, and writes back only the
chunk's new frames, over the oldest (``RingRows``). Copying the whole cache in and out every step was most of
a large streaming step's time.
"""

from __future__ import annotations

import math

import torch

from oasr.cache_memory import cache_zeros
from oasr.streaming.geometry import StateField


class StreamStatePool:
    def __init__(self, fields: tuple[StateField, ...], num_slots: int, device: torch.device,
                 dtype: torch.dtype) -> None:
        names = [f.name for f in fields]
        if len(set(names)) != len(names):
            raise ValueError(f"state fields named twice: {names}")
        self.num_slots = num_slots
        self.rings = frozenset(f.name for f in fields if f.ring)
        self.tensors = {f.name: cache_zeros((num_slots, *f.shape), dtype=dtype, device=device) for f in fields}

    @property
    def bytes_per_stream(self) -> int:
        return sum(t[0].numel() * t.element_size() for t in self.tensors.values())

    def gather(self, slots: torch.Tensor, frames_done: torch.Tensor | None = None) -> dict:
        """slots: [B] on the pool's device -> every field's rows: [B, *shape] copies, and for a ring field a
        ``RingRows`` reading it in place; frames_done: [B], the frames each row's stream has appended to its
        ring fields so far (needed where the pool has any)."""
        rows: dict = {}
        for name, t in self.tensors.items():
            if name not in self.rings:
                rows[name] = t.index_select(0, slots)
            elif frames_done is None:
                raise ValueError(f"state field {name!r} is a ring: gathering it needs each row's frames done")
            else:
                rows[name] = RingRows(t, slots, frames_done)
        return rows

    def scatter(self, slots: torch.Tensor, rows: dict[str, torch.Tensor]) -> None:
        """Writes ``rows`` ({field: [B, *shape]}, every field or some; never a ring, written in place) to
        ``slots``."""
        for name, value in rows.items():
            if name in self.rings:
                raise ValueError(f"state field {name!r} is a ring: its rows are appended in place")
            t = self.tensors[name]
            t.index_copy_(0, slots, value.to(t.dtype))

    def clear(self, slots: torch.Tensor, values: dict[str, torch.Tensor] | None = None) -> None:
        """Zeroes ``slots``, then broadcasts ``values`` ({field: [*shape]}) into them where given."""
        for name, t in self.tensors.items():
            t.index_fill_(0, slots, 0)
            if values and name in values:
                t.index_copy_(0, slots, values[name].to(t.dtype).expand(len(slots), *values[name].shape))


class RingRows:
    """A step's rows of one ring field, [num_slots, layers, *inner, frames, width] in the pool: each row's
    stream keeps its latest ``frames`` frames, frame ``n`` of the stream at ring position ``n % frames``.

    ``window(layer, room)`` copies a layer's frames out in order (oldest first) with room after them for the
    chunk's; ``append(layer, new)`` writes the chunk's frames over the oldest. Index arithmetic only, so a step
    that reads and writes through it has fixed shapes and can be captured as a CUDA graph.
    """

    def __init__(self, store: torch.Tensor, slots: torch.Tensor, frames_done: torch.Tensor) -> None:
        self.store = store
        self.layers, *self.inner, self.frames, self.width = store.shape[1:]
        self._rows = store.view(-1, self.width)  # one frame of one (slot, layer, inner) a row
        per_slot = self.layers * math.prod(self.inner)
        inner = torch.arange(math.prod(self.inner), device=store.device).view(1, *self.inner, 1)
        # The row of (slot, layer 0, inner) at ring position 0, [B, *inner, 1]; a layer adds layer * stride.
        self._base = (slots.view(-1, *[1] * len(self.inner), 1).long() * per_slot + inner) * self.frames
        self._start = frames_done.long().view(-1, *[1] * len(self.inner), 1)
        self._stride = math.prod(self.inner) * self.frames
        self._read: dict[int, torch.Tensor] = {}
        self._write: dict[int, tuple[int, torch.Tensor]] = {}

    def window(self, layer: int, room: int) -> torch.Tensor:
        """[B, *inner, frames + room, width]: the layer's frames of each row, oldest first (a copy), then ``room``
        frames of no meaning for the chunk's own."""
        if room not in self._read:
            self._read[room] = self._layer0_rows(0, self.frames + room)
        out = self._rows.index_select(0, self._read[room] + layer * self._stride)
        return out.view(*self._base.shape[:-1], self.frames + room, self.width)

    def append(self, layer: int, new: torch.Tensor) -> None:
        """new: [B, *inner, T, width], the frames after each row's last -> written in place over its oldest (of T
        frames beyond the ring's length, only the newest are kept)."""
        num_new = new.shape[-2]
        if num_new not in self._write:
            keep = min(num_new, self.frames)
            self._write[num_new] = keep, self._layer0_rows(num_new - keep, num_new)
        keep, index = self._write[num_new]
        self._rows.index_copy_(0, index + layer * self._stride,
                               new[..., num_new - keep:, :].reshape(-1, self.width).to(self.store.dtype))

    def _layer0_rows(self, first: int, end: int) -> torch.Tensor:
        """The flat rows, in layer 0, of each row's stream frames ``frames_done + first`` to ``frames_done + end``
        (exclusive), [B * inner * (end - first)]; a layer adds ``layer * self._stride``."""
        offsets = torch.arange(first, end, device=self.store.device)
        return (self._base + (self._start + offsets) % self.frames).flatten()
