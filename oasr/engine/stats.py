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
    # Several engine replicas behind one server (``oasr serve --ray-replicas``): each one's own numbers, while
    # the fields above are their sum. Empty for a single engine.
    replicas: tuple[ReplicaStats, ...] = ()


@dataclass(frozen=True)
class ReplicaStats:
    """One replica as the server that routes to it sees it."""

    replica_id: int
    up: bool  # it answered its last call; False while it is dead or restarting
    num_requests: int  # engine requests (30 s windows) routed to it since the server started
    num_in_flight: int  # of those, routed and not yet finished
    engine: EngineStats  # its own last report (its counts start again when it restarts)
