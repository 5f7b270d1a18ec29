"""Per-stream state in slots: one tensor per declared field, [num_slots, *field.shape], allocated once.

A step gathers the rows of its streams' slots, the model computes their new state, and the step scatters it
back; nothing is allocated per stream. A slot is zeroed when a stream takes it, so a stream never sees the
state of the one before it.
"""

from __future__ import annotations

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
        self.tensors = {f.name: cache_zeros((num_slots, *f.shape), dtype=dtype, device=device) for f in fields}

    @property
    def bytes_per_stream(self) -> int:
        return sum(t[0].numel() * t.element_size() for t in self.tensors.values())

    def gather(self, slots: torch.Tensor) -> dict[str, torch.Tensor]:
        """slots: [B] on the pool's device -> every field's rows, [B, *shape] (copies)."""
        return {name: t.index_select(0, slots) for name, t in self.tensors.items()}

    def scatter(self, slots: torch.Tensor, rows: dict[str, torch.Tensor]) -> None:
        """Writes ``rows`` ({field: [B, *shape]}, every field or some) to ``slots``."""
        for name, value in rows.items():
            t = self.tensors[name]
            t.index_copy_(0, slots, value.to(t.dtype))

    def clear(self, slots: torch.Tensor, values: dict[str, torch.Tensor] | None = None) -> None:
        """Zeroes ``slots``, then broadcasts ``values`` ({field: [*shape]}) into them where given."""
        for name, t in self.tensors.items():
            t.index_fill_(0, slots, 0)
            if values and name in values:
                t.index_copy_(0, slots, values[name].to(t.dtype).expand(len(slots), *values[name].shape))
