"""What a streaming encoder declares to the engine: its chunk geometry and the per-stream state it carries.

Plain data, no tensors: the scheduler plans chunks from ``StreamGeometry`` and the state pool allocates one row
of every ``StateField`` per stream slot. Nothing here is specific to one architecture; the encoder fills them
in from its own configuration (``oasr.models.nemotron_streaming.stream``).
"""

from __future__ import annotations

from dataclasses import dataclass

from oasr.errors import OASRError


@dataclass(frozen=True)
class StateField:
    """One tensor of per-stream state: ``shape`` is one stream's (the pool adds the slot axis in front)."""

    name: str
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.name or any(n < 0 for n in self.shape):
            raise ValueError(f"bad state field {self.name!r} {self.shape}")


@dataclass(frozen=True)
class StreamGeometry:
    """How a cache-aware encoder consumes a stream, for one lookahead.

    Every chunk yields ``chunk_frames`` encoder frames. The first chunk needs ``first_feature_frames`` feature
    frames, every later one ``feature_frames``; the encoder is handed ``feature_frames`` for the first chunk too,
    the missing ones zero in front (``first_padding_frames``), so every step has one shape.
    """

    lookahead: int  # right context in encoder frames: a frame is final once this many frames follow it
    chunk_frames: int  # encoder frames per chunk (lookahead + 1)
    first_feature_frames: int
    feature_frames: int
    past_frames: int  # encoder frames of attention context each stream keeps (its cache length)
    visible_past_frames: int  # of those, how many a chunk's queries may see (whole chunks of left context)
    frame_seconds: float  # audio time of one encoder frame
    state: tuple[StateField, ...] = ()

    def __post_init__(self) -> None:
        if self.lookahead < 0 or self.chunk_frames != self.lookahead + 1:
            raise ValueError(f"chunk of {self.chunk_frames} frames does not fit lookahead {self.lookahead}")
        if not 0 < self.first_feature_frames <= self.feature_frames:
            raise ValueError("the first chunk must need between 1 and feature_frames feature frames")
        if not 0 <= self.visible_past_frames <= self.past_frames:
            raise ValueError("visible_past_frames must lie within past_frames")

    @property
    def first_padding_frames(self) -> int:
        return self.feature_frames - self.first_feature_frames

    @property
    def chunk_seconds(self) -> float:
        return self.chunk_frames * self.frame_seconds

    def chunk_range(self, index: int) -> tuple[int, int]:
        """Feature frames [start, end) of a stream's chunk ``index``: the first chunk's from frame 0, each later
        one's right after the one before."""
        if index == 0:
            return 0, self.first_feature_frames
        start = self.first_feature_frames + (index - 1) * self.feature_frames
        return start, start + self.feature_frames

    def visible_past(self, num_chunks_done: int) -> int:
        """Encoder frames of a stream's past its next chunk may attend to, after ``num_chunks_done`` chunks."""
        return min(self.visible_past_frames, num_chunks_done * self.chunk_frames)


def lookahead_for(chunk_ms: int, frame_seconds: float) -> int:
    """The lookahead whose chunks last ``chunk_ms``; refuses a length that is not whole encoder frames."""
    frame_ms = round(frame_seconds * 1000)
    if chunk_ms % frame_ms or chunk_ms < frame_ms:
        raise OASRError(f"a chunk of {chunk_ms} ms is not a whole number of {frame_ms} ms encoder frames")
    return chunk_ms // frame_ms - 1
