"""What an engine reports of its load: plain numbers, readable without torch (the server's API processes)."""

from __future__ import annotations

from dataclasses import dataclass

from oasr.engine.batch_stats import BatchSizeCounts


@dataclass(frozen=True)
class EngineStats:
    num_waiting: int
    num_running: int
    kv_blocks_used: int
    kv_blocks_total: int
    num_slots: int
    encode_batch_sizes: BatchSizeCounts = BatchSizeCounts()  # rows of each step's encode walk, since start
    decode_batch_sizes: BatchSizeCounts = BatchSizeCounts()  # rows of each step's decode walk, since start
    num_streams: int = 0  # live streams open (a streaming model's engine core)
    stream_slots: int = 0  # streams it can hold at once; 0: the served model does not stream
