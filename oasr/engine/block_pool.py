"""A free list of KV block ids. Block 0 is reserved as the null block that idle decode rows write into.

The list is a stack: a freed block is the next one handed out, so the blocks in use stay among the lowest ids
and a host cache is resident only as far as the peak load reached (see ``oasr.cache_memory.cache_zeros``)."""

from __future__ import annotations

NULL_BLOCK = 0


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 2:
            raise ValueError("a block pool needs at least 2 blocks (one is the null block)")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free = list(range(num_blocks - 1, 0, -1))  # block 1 on top

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - 1 - len(self._free)

    def blocks_for(self, num_positions: int) -> int:
        return -(-num_positions // self.block_size)

    def allocate(self, count: int) -> list[int] | None:
        """``count`` blocks, or None (and nothing taken) when fewer are free."""
        if count > len(self._free):
            return None
        return [self._free.pop() for _ in range(count)]

    def free(self, block_ids: list[int]) -> None:
        self._free.extend(reversed(block_ids))
