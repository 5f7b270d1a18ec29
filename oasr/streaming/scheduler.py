"""The streams' bookkeeping, without tensors: which stream holds which slot, how much of its audio its chunks
have consumed, and which streams have a chunk ready. Its output, a ``ChunkBatch``, is plain data the runtime
turns into one forward; its tests run without a model.

A stream's chunk k covers the feature frames ``StreamGeometry.chunk_range(k)``. A chunk is ready once its
last frame's samples have arrived, or, after the stream is closed, while any of its frames is real (the rest
are zero, as the references pad a stream's last chunk; how much of it is then decoded is the checkpoint's
tail rule, ``StreamGeometry.tail``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from oasr.streaming.audio import StreamAudio
from oasr.streaming.endpointing import Endpointer
from oasr.streaming.geometry import StreamGeometry


@dataclass(frozen=True)
class ChunkRow:
    """One stream's chunk in a step: the K = ``feature_frames`` frames from ``first_frame`` on, of which
    [``lead_frames``, ``real_frames``) are computed from audio and the rest are zero."""

    stream_id: str
    slot: int
    chunk_index: int
    first_frame: int  # feature frame of the window's start (negative for a first chunk: its zero lead)
    lead_frames: int
    real_frames: int
    prompt_id: int | None


@dataclass(frozen=True)
class ChunkBatch:
    lookahead: int
    rows: tuple[ChunkRow, ...]


@dataclass
class StreamRecord:
    stream_id: str
    slot: int
    geometry: StreamGeometry
    audio: StreamAudio
    prompt_id: int | None = None
    endpointer: Endpointer | None = None
    num_chunks: int = 0  # chunks encoded
    utterance: int = 0  # index of the current utterance
    tokens: list[int] = field(default_factory=list)  # the current utterance's tokens
    utterance_start_frame: int = 0  # encoder frame where the current utterance began
    arrival: int = 0  # order of opening, for fairness between lookaheads

    def chunk_range(self, index: int) -> tuple[int, int]:
        return self.geometry.chunk_range(index)

    @property
    def chunk_ready(self) -> bool:
        start, end = self.chunk_range(self.num_chunks)
        ready = self.audio.num_frames_ready
        return ready >= end or (self.audio.closed and ready > start)

    @property
    def exhausted(self) -> bool:
        """Closed, and every real frame has been encoded."""
        return self.audio.closed and self.audio.num_frames_ready <= self.chunk_range(self.num_chunks)[0]

    @property
    def encoded_frames(self) -> int:
        return self.num_chunks * self.geometry.chunk_frames

    def next_row(self) -> ChunkRow:
        start, end = self.chunk_range(self.num_chunks)
        lead = self.geometry.feature_frames - (end - start)  # the first chunk's zeros in front
        real = lead + min(end, self.audio.num_frames_ready) - start
        return ChunkRow(self.stream_id, self.slot, self.num_chunks, start - lead, lead, real, self.prompt_id)


class StreamScheduler:
    """Streams by id, a free list of slots, and the choice of which ready streams go into the next step."""

    def __init__(self, num_slots: int, max_batch: int) -> None:
        if num_slots < 1 or max_batch < 1:
            raise ValueError("a stream scheduler needs at least one slot and one row per step")
        self.max_batch = max_batch
        self.streams: dict[str, StreamRecord] = {}
        self._free = list(range(num_slots - 1, -1, -1))  # the lowest slot first
        self._arrivals = 0

    @property
    def num_free_slots(self) -> int:
        return len(self._free)

    def take_slot(self) -> int | None:
        return self._free.pop() if self._free else None

    def add(self, record: StreamRecord) -> None:
        if record.stream_id in self.streams:
            raise ValueError(f"stream id {record.stream_id!r} is already open")
        record.arrival, self._arrivals = self._arrivals, self._arrivals + 1
        self.streams[record.stream_id] = record

    def remove(self, stream_id: str) -> StreamRecord:
        record = self.streams.pop(stream_id)
        self._free.append(record.slot)
        return record

    def schedule(self) -> ChunkBatch | None:
        """The ready streams of one lookahead, the longest waiting lookahead first, at most ``max_batch``."""
        ready = sorted((r for r in self.streams.values() if r.chunk_ready),
                       key=lambda r: (r.num_chunks, r.arrival))
        if not ready:
            return None
        lookahead = ready[0].geometry.lookahead
        rows = [r.next_row() for r in ready if r.geometry.lookahead == lookahead][: self.max_batch]
        return ChunkBatch(lookahead, tuple(rows))

    def has_ready(self) -> bool:
        """Whether a step now would do anything: encode a chunk, or finish a closed stream."""
        return any(r.chunk_ready or r.exhausted for r in self.streams.values())

    def exhausted(self) -> list[str]:
        return [r.stream_id for r in self.streams.values() if r.exhausted]
