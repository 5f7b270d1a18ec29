"""The ``paraformer_chunked`` streaming runtime: FunASR's online Paraformer (``oasr.models.paraformer_streaming``)
behind the streaming engine, each stream stepped as FunASR's ``generate(input=piece, cache=cache,
is_final=...)`` steps it.

A stream's chunk is ``lookahead + 1`` LFR frames of 60 ms (FunASR's ``chunk_size[1]``; 10 by default, with half
a chunk of look-ahead, ``chunk_size [0, 10, 5]``): the samples of one FunASR step. ``LfrStepAudio`` cuts the
stream where FunASR's cache cuts it: an open stream's chunk is ready once all its samples have arrived; a closed
one gets exactly one more, final, step with whatever is left (possibly nothing: FunASR then re-encodes the last
overlap). The engine's windows are those samples, raw; the stream's own frontend, encoder, CIF and decoder
caches live here, one ``ParaformerStream`` per slot, because the encoder's look-back grows over the first chunks
and the CIF fires a varying number of tokens, neither of which the cache-aware runtime's fixed-shape state fits.

The rows of a step run one after another (batch of one each): parity first. Batching them (one encoder forward
over every stream past its look-back warm-up, the CIF loop vectorised over rows) is the step to take for many
streams on a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from oasr.streaming import STREAMING_RUNTIMES
from oasr.streaming.audio import StreamAudio
from oasr.streaming.geometry import StreamGeometry
from oasr.streaming.scheduler import ChunkBatch, ChunkRow


class StreamedModel(Protocol):
    """What the runtime reads of a loaded model (``oasr.models.loader.LoadedModel`` is one)."""

    name: str
    model: Any  # ``ParaformerStreaming``: ``open_stream(fbank, chunk)``, ``stream_chunk(frames)``, ``chunk``
    features: Any  # ``FunasrFbank``: its ``config`` (sample rate, hop, lfr_n)


@dataclass(frozen=True)
class StepTokens:
    token_ids: list[list[int]]  # per row, the tokens its step decided
    token_frames: list[list[int]]  # per row, the chunk frame each token fired at


class LfrStepAudio(StreamAudio):
    """A stream's raw samples, in whole LFR frames: frame j is samples [j * hop, (j + 1) * hop)."""

    def __init__(self, hop: int) -> None:
        super().__init__(hop, 0, 0.0)

    @property
    def num_frames_ready(self) -> int:
        # Closed: one frame more than have arrived whole, so that the engine schedules exactly one last step
        # after the last full chunk, with the samples left (FunASR's ``is_final`` step).
        return self.num_samples // self.hop + int(self.closed)

    def window(self, first_frame: int, num_frames: int) -> np.ndarray:
        """The samples of frames [first_frame, first_frame + num_frames) that have arrived: fewer than a whole
        chunk only on a closed stream's last step."""
        begin = first_frame * self.hop - self.start
        return self.samples[max(begin, 0): max(begin + num_frames * self.hop, 0)].copy()


@STREAMING_RUNTIMES.register("paraformer_chunked")
class ParaformerChunkedRuntime:
    default_lookahead: int
    sample_rate: int
    frame_seconds: float

    def __init__(self, loaded: StreamedModel, num_slots: int, *, cuda_graphs: bool = True) -> None:
        del cuda_graphs  # rows run eagerly, one stream at a time
        self.loaded, self.model = loaded, loaded.model
        features = loaded.features.config
        self.sample_rate = features.sample_rate
        self.hop = features.hop_length * features.lfr_n  # samples of one LFR frame
        self.frame_seconds = self.hop / self.sample_rate
        self.default_lookahead = self.model.chunk.chunk_size[1] - 1
        self.num_slots = num_slots
        self._streams: dict[int, Any] = {}  # slot -> its ParaformerStream, made at its first step
        self._geometries: dict[int, StreamGeometry] = {}

    def warm_up(self, lookahead: int, max_rows: int) -> None:
        """One step of silence, so that no live stream pays for the kernels' first use."""
        del max_rows  # rows run one at a time: one shape per step length
        stream = self.model.open_stream(self.loaded.features, self._chunk(lookahead))
        stream.step(np.zeros((lookahead + 1) * self.hop, dtype=np.float32), False)

    def geometry(self, lookahead: int) -> StreamGeometry:
        if lookahead not in self._geometries:
            self._chunk(lookahead)  # refuses one FunASR's chunking cannot take
            frames = lookahead + 1
            self._geometries[lookahead] = StreamGeometry(lookahead, frames, frames, frames, 0, 0,
                                                         self.frame_seconds)
        return self._geometries[lookahead]

    def _chunk(self, lookahead: int) -> Any:
        """The model's chunking for chunks of ``lookahead + 1`` frames (``ValueError`` if it has none)."""
        return self.model.stream_chunk(lookahead + 1)

    def new_audio(self) -> StreamAudio:
        return LfrStepAudio(self.hop)

    def open(self, slot: int) -> None:
        self._streams.pop(slot, None)

    def reset_decoder(self, slots: list[int]) -> None:
        """Endpoints: the decoder forgets the finished utterance's tokens and frames; the encoder and the CIF's
        carried weight go on (the audio does)."""
        for slot in slots:
            if slot in self._streams:
                self._streams[slot].state.reset_decoder()

    def step(self, batch: ChunkBatch, windows: list[np.ndarray]) -> StepTokens:
        chunk = self._chunk(batch.lookahead)
        token_ids, token_frames = [], []
        for row, window in zip(batch.rows, windows, strict=True):
            ids, frames = self._stream(row, chunk).step(window, len(window) < chunk.chunk_samples)
            token_ids.append(ids)
            # Tokens fired on the overlap (the previous chunk's look-ahead) are counted at this chunk's start.
            token_frames.append([min(max(f, 0), batch.lookahead) for f in frames])
        return StepTokens(token_ids, token_frames)

    def _stream(self, row: ChunkRow, chunk):
        if row.chunk_index == 0 or row.slot not in self._streams:
            self._streams[row.slot] = self.model.open_stream(self.loaded.features, chunk)
        return self._streams[row.slot]
