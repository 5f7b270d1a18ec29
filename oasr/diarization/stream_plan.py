"""Where a diarization stream's chunks lie, tensor-free: the speaker cache runtime reads them, the scheduler plans
with them.

A latency mode is ``(chunk, lookahead)`` encoder frames of ``factor`` mel frames each. Chunk i reads mel frames
from ``i * chunk * factor`` on, ``(chunk + lookahead) * factor`` of them, and scores the first
``chunk * factor``; the look-ahead frames open the next chunk. The last chunk scores everything left. Whether a
chunk is the last is decided as transformers' processor decides it from the samples a chunk is fed (the first
chunk ``first_samples``, later ones ``chunk_samples`` from ``cursor * hop - n_fft / 2``): a chunk whose samples
reach the end of a closed stream is its last, so a stream waits for one sample past a chunk's samples before
it runs the chunk with its look-ahead.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StreamMode:
    name: str
    chunk: int  # encoder frames scored per chunk
    lookahead: int  # encoder frames after them that each chunk reads
    factor: int  # mel frames per encoder frame
    hop: int  # samples per mel frame
    n_fft: int
    win_length: int
    sample_rate: int

    def __post_init__(self) -> None:
        if self.chunk < 1 or self.lookahead < 0:
            raise ValueError(f"mode {self.name!r}: chunk {self.chunk} must be >= 1 and lookahead {self.lookahead} >= 0")

    @property
    def chunk_mel_frames(self) -> int:
        """Mel frames a chunk with its look-ahead reads."""
        return (self.chunk + self.lookahead) * self.factor

    @property
    def step_mel_frames(self) -> int:
        return self.chunk * self.factor

    @property
    def first_samples(self) -> int:
        return (self.chunk_mel_frames - 1) * self.hop + self.win_length // 2

    @property
    def chunk_samples(self) -> int:
        return self.chunk_mel_frames * self.hop + self.win_length

    @property
    def latency_seconds(self) -> float:
        """Audio a chunk waits for beyond its first frame: its frames and its look-ahead."""
        return self.chunk_mel_frames * self.hop / self.sample_rate

    def samples_end(self, index: int) -> int:
        """The samples chunk ``index`` is fed end here (transformers' processor)."""
        if index == 0:
            return self.first_samples
        return index * self.step_mel_frames * self.hop - self.n_fft // 2 + self.chunk_samples


@dataclass(frozen=True)
class PlannedChunk:
    index: int
    first_frame: int  # mel frame the chunk starts at
    num_frames: int  # mel frames it reads
    lookahead: int  # encoder frames of look-ahead (0 for the last chunk)
    last: bool


def plan_chunk(mode: StreamMode, index: int, num_samples: int, closed: bool) -> PlannedChunk | None:
    """Chunk ``index`` if it can run now (None while it waits for audio)."""
    first_frame = index * mode.step_mel_frames
    if num_samples > mode.samples_end(index):
        return PlannedChunk(index, first_frame, mode.chunk_mel_frames, mode.lookahead, False)
    if not closed:
        return None
    total = num_samples // mode.hop  # the offline frontend's real frames
    if total <= first_frame:
        return None  # nothing left: the stream is done
    return PlannedChunk(index, first_frame, total - first_frame, 0, True)
