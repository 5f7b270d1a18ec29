"""How the online Paraformer chunks a stream, under the names FunASR's ``generate`` takes them (the network's
own configuration is the offline Paraformer's ``ParaformerConfig``).

``chunk_size`` is FunASR's ``[left, chunk, right]`` in 60 ms LFR frames: each step encodes ``chunk`` new frames
after the ``left + right`` frames the previous step ended on, and the CIF predictor weighs the frames from
``left`` up to ``left + chunk`` (the last ``right`` are the step's look-ahead, weighed in the next step).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ChunkConfig:
    chunk_size: tuple[int, int, int] = (0, 10, 5)  # FunASR's example setting: 600 ms chunks, 300 ms look-ahead
    encoder_chunk_look_back: int = 4  # chunks of past keys and values each encoder layer attends to
    decoder_chunk_look_back: int = 1  # chunks of past encoder frames the decoder's cross-attention reads

    def __post_init__(self) -> None:
        left, chunk, right = self.chunk_size
        if left < 0 or chunk < 1 or right < 1:
            raise ValueError(f"chunk_size {list(self.chunk_size)}: the chunk and its look-ahead must be at least "
                             f"one frame, the left context not negative")
        if self.encoder_chunk_look_back < 1 or self.decoder_chunk_look_back < 1:
            raise ValueError("encoder_chunk_look_back and decoder_chunk_look_back must be at least 1 (FunASR's "
                             "-1 and 0, whole past or none, are not served)")

    @property
    def overlap_frames(self) -> int:
        """LFR frames a step re-reads from the step before (its left context plus the look-ahead)."""
        return self.chunk_size[0] + self.chunk_size[2]

    @property
    def chunk_samples(self) -> int:
        """16 kHz samples of one chunk: FunASR's ``chunk_size[1] * 960`` (60 ms a frame)."""
        return self.chunk_size[1] * 960

