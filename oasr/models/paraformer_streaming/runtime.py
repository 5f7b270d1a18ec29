"""The ``paraformer_chunked`` streaming runtime: FunASR's online Paraformer (``oasr.models.paraformer_streaming``)
behind the streaming engine, each stream stepped as FunASR's ``generate(input=piece, cache=cache,
is_final=...)`` steps it.

A stream's chunk is ``lookahead + 1`` LFR frames of 60 ms (FunASR's ``chunk_size[1]``; 10 by default, with half
a chunk of look-ahead, ``chunk_size [0, 10, 5]``): the samples of one FunASR step. ``LfrStepAudio`` cuts the
stream where FunASR's cache cuts it: an open stream's chunk is ready once all its samples have arrived; a closed
one gets exactly one more, final, step with whatever is left (possibly nothing: FunASR then re-encodes the last
overlap). The engine's windows are those samples, raw; the stream's own frontend, encoder, CIF and decoder
caches live here: each slot's frontend on the host, its tensors in ``StreamSlots`` (one pool per chunk length),
because the CIF fires a varying number of tokens a step, which the cache-aware runtime's state does not fit.

A step's rows run together (``step_streams``): one encoder forward, one CIF loop and one decoder forward over
the rows that fired, for all rows of one shape; only streams closing in this step, whose last chunk is short,
take a forward of their own shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from oasr.models.paraformer_streaming.frontend import OnlineFrontend, warm_fbank
from oasr.models.paraformer_streaming.state import StreamSlots
from oasr.models.paraformer_streaming.stream import StepRow, step_streams
from oasr.streaming import STREAMING_RUNTIMES
from oasr.streaming.audio import StreamAudio
from oasr.streaming.geometry import StreamGeometry
from oasr.streaming.scheduler import ChunkBatch


class StreamedModel(Protocol):
    """What the runtime reads of a loaded model (``oasr.models.loader.LoadedModel`` is one)."""

    name: str
    model: Any  # ``ParaformerStreaming``: ``stream_chunk(frames)``, ``chunk``, ``step_chunk``
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
        del cuda_graphs  # steps run eagerly: a step's shapes vary with the tokens fired
        self.loaded, self.model = loaded, loaded.model
        features = loaded.features.config
        self.sample_rate = features.sample_rate
        self.hop = features.hop_length * features.lfr_n  # samples of one LFR frame
        self.frame_seconds = self.hop / self.sample_rate
        self.default_lookahead = self.model.chunk.chunk_size[1] - 1
        self.device = self.model.decoder.output_layer.weight.device
        self.num_slots = num_slots
        self._frontends: dict[int, OnlineFrontend] = {}  # slot -> its stream's frontend, made at its first step
        self._slots: dict[int, StreamSlots] = {}  # lookahead -> the slots' tensors, made at its first step
        self._geometries: dict[int, StreamGeometry] = {}

    def warm_up(self, lookahead: int, max_rows: int) -> None:
        """Steps of silence over ``max_rows`` slots (the look-back filling, then whole), so that no live stream
        pays for the kernels' first use or the slots' allocation."""
        slots = self._slots_for(lookahead)
        rows = list(range(min(max_rows, self.num_slots)))
        # A closing stream's last step makes at most a chunk and one frame, K LFR frames reading (K - 1) * lfr_n
        # + lfr_m fbank frames.
        c = self.loaded.features.config
        warm_fbank(self.loaded.features, len(rows), (lookahead + 1) * c.lfr_n + c.lfr_m, self.device)
        slots.open(rows)
        frontends = [OnlineFrontend(self.loaded.features) for _ in rows]
        silence = np.zeros((lookahead + 1) * self.hop, dtype=np.float32)
        for _ in range(self.model.chunk.encoder_chunk_look_back + 1):
            step_streams(self.model, slots, [StepRow(r, f, silence, False) for r, f in zip(rows, frontends)])
        slots.open(rows)

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

    def _slots_for(self, lookahead: int) -> StreamSlots:
        if lookahead not in self._slots:
            self._slots[lookahead] = StreamSlots(self.model, self._chunk(lookahead), self.num_slots)
        return self._slots[lookahead]

    def new_audio(self) -> StreamAudio:
        return LfrStepAudio(self.hop)

    def open(self, slot: int) -> None:
        self._frontends.pop(slot, None)

    def reset_decoder(self, slots: list[int]) -> None:
        """Endpoints: the decoder forgets the finished utterance's tokens and frames; the encoder and the CIF's
        carried weight go on (the audio does)."""
        for pool in self._slots.values():
            pool.reset_decoder(slots)

    def step(self, batch: ChunkBatch, windows: list[np.ndarray]) -> StepTokens:
        chunk = self._chunk(batch.lookahead)
        slots = self._slots_for(batch.lookahead)
        starting = [row.slot for row in batch.rows if row.chunk_index == 0 or row.slot not in self._frontends]
        if starting:
            slots.open(starting)
            for slot in starting:
                self._frontends[slot] = OnlineFrontend(self.loaded.features)
        rows = [StepRow(row.slot, self._frontends[row.slot], window, len(window) < chunk.chunk_samples)
                for row, window in zip(batch.rows, windows, strict=True)]
        decided = step_streams(self.model, slots, rows)
        # Tokens fired on the overlap (the previous chunk's look-ahead) are counted at this chunk's start.
        return StepTokens([ids for ids, _ in decided],
                          [[min(max(f, 0), batch.lookahead) for f in frames] for _, frames in decided])
