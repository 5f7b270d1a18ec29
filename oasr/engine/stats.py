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
    final_pass: FinalPassStats | None = None  # the two-pass final's numbers; None: the server has no final model
    # Several engine replicas behind one server (``oasr serve --ray-replicas``): each one's own numbers, while
    # the fields above are their sum. Empty for a single engine.
    replicas: tuple[ReplicaStats, ...] = ()


@dataclass(frozen=True)
class FinalPassStats:
    """The two-pass final (``--final-model``): streamed utterances whose final is held, what became of the
    finals handed out since the engine started, and the final model's own engine requests."""

    num_waiting: int  # utterances whose final is held (being transcribed, or behind an earlier one of its stream)
    num_completed: int  # finals handed out with the final model's text
    num_fallbacks: int  # finals handed out with the online text: the final model could not take the audio
    num_requests_waiting: int  # the final model's engine requests (windows of the utterances) queued
    num_requests_running: int  # ... and those it is decoding


@dataclass(frozen=True)
class ReplicaStats:
    """One replica as the server that routes to it sees it."""

    replica_id: int
    up: bool  # it answered its last call; False while it is dead or restarting
    num_requests: int  # engine requests (30 s windows) routed to it since the server started
    num_in_flight: int  # of those, routed and not yet finished
    engine: EngineStats  # its own last report (its counts start again when it restarts)
