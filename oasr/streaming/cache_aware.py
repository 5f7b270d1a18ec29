"""The ``cache_aware`` streaming runtime: a cache-aware encoder (chunked-limited attention, causal convolutions)
and a greedy transducer, every ready stream's chunk in one forward per step.

Per step: the streams' sample windows go up in one copy and become their chunks' feature frames; each stream's
state is gathered from its slot (the encoder's caches and the predictor's context, as the model declares
them); the encoder runs the chunk (``stream_encode``), the label loop continues each stream's decoding over the
chunk's frames, and the new state is scattered back to the slots.

Model contract, beyond the transducer strategies' (``oasr.decode.transducer_greedy``): ``default_lookahead``,
``stream_geometry(lookahead, frame_seconds) -> StreamGeometry`` (its ``state`` includes the predictor's
fields, its ``tail`` the checkpoint's rule for a stream's last chunk), ``stream_encode(features [B, K, n_mels],
state, first [B], past_valid [B, L], geometry, real [B, chunk_frames]) -> (hidden [B, chunk_frames, D], new
encoder state)``, where ``real`` marks the chunk's frames that hold audio (all of them but in a stream's last
chunk under the "mask" tail rule, whose frames past the audio no attention may read), ``predictor_rows`` / ``predictor_from_rows``,
``prompt_id(options)`` and ``fuse_prompt(hidden, prompt_ids)``.
"""

from __future__ import annotations

import functools
from typing import Any, Protocol

import numpy as np
import torch

from oasr.decode.transducer_stream import ChunkTokens, decode_chunk
from oasr.streaming import STREAMING_RUNTIMES
from oasr.streaming.audio import StreamAudio
from oasr.streaming.geometry import StreamGeometry
from oasr.streaming.scheduler import ChunkBatch, ChunkRow
from oasr.streaming.state_pool import StreamStatePool
from oasr.streaming.step_graphs import StepGraphs
from oasr.uploads import upload, upload_tensor


class StreamedModel(Protocol):
    """What the runtime reads of a loaded model (``oasr.models.loader.LoadedModel`` is one): the runtime sits
    below the models it runs, so it names what it reads instead of importing the loader."""

    name: str
    model: Any  # the architecture: the contract in this module's docstring
    features: Any  # the feature extractor: ``config`` and ``window_frames(samples)``
    device: torch.device
    dtype: torch.dtype


@STREAMING_RUNTIMES.register("cache_aware")
class CacheAwareRuntime:
    # Set in __init__ from the model and its features (the StreamingRuntime contract's attributes).
    default_lookahead: int
    sample_rate: int
    frame_seconds: float

    def __init__(self, loaded: StreamedModel, num_slots: int, *, cuda_graphs: bool = True) -> None:
        self.loaded, self.model, self.device = loaded, loaded.model, loaded.device
        self._graphs = StepGraphs() if cuda_graphs and self.device.type == "cuda" else None
        features = loaded.features.config
        if getattr(features, "normalize", False):
            raise ValueError(f"{loaded.name}: its features are normalised over the whole input and cannot stream")
        self.sample_rate, self.hop = features.sample_rate, features.hop_length
        self._audio_args = (features.hop_length, features.n_fft, features.preemphasis)
        encoder = self.model.config.encoder_config
        self.frame_seconds = encoder.subsampling_factor * features.hop_length / features.sample_rate
        self._geometries: dict[int, StreamGeometry] = {}
        self.default_lookahead = self.model.default_lookahead
        geometry = self.geometry(self.default_lookahead)
        # One more slot than streams: rows that pad a step to its batch bucket read and write this one.
        self.scratch_slot = num_slots
        self.pool = StreamStatePool(geometry.state, num_slots + 1, self.device, loaded.dtype)
        self._opened: set[int] = set()  # slots taken since the last step, cleared together at the next
        with torch.inference_mode():
            start = self.model.predictor_rows(*self.model.predictor_init(1, self.device))
        self._start = {name: rows[0] for name, rows in start.items()}  # a stream's context before any token

    def warm_up(self, lookahead: int, max_rows: int) -> None:
        """Runs a step of silence at every batch bucket up to ``max_rows`` through the scratch slot, so that no
        live step pays for the kernels' first use at a shape (cuFFT, cuDNN and cuBLAS plans)."""
        geometry = self.geometry(lookahead)
        window = self.new_audio().window(0, geometry.feature_frames)
        size = 1
        while True:
            rows = tuple(ChunkRow("warm-up", self.scratch_slot, 0, -geometry.first_padding_frames,
                                  geometry.first_padding_frames, geometry.feature_frames, None)
                         for _ in range(min(size, max_rows)))
            self.step(ChunkBatch(lookahead, rows), [window] * len(rows))
            if size >= max_rows:
                break
            size *= 2
        self.open(self.scratch_slot)
        self._clear_opened()

    def geometry(self, lookahead: int) -> StreamGeometry:
        if lookahead not in self._geometries:
            self._geometries[lookahead] = self.model.stream_geometry(lookahead, self.frame_seconds)
        return self._geometries[lookahead]

    def new_audio(self) -> StreamAudio:
        return StreamAudio(*self._audio_args)

    def open(self, slot: int) -> None:
        """A stream takes ``slot``: no past, the predictor at the start of a sequence. The slot is cleared with
        the others opened before the next step, in one launch a field (a thousand streams opening at once
        would otherwise cost ten launches each)."""
        self._opened.add(slot)

    @torch.inference_mode()
    def _clear_opened(self) -> None:
        if self._opened:
            self.pool.clear(upload(self.device, sorted(self._opened))[0], self._start)
            self._opened.clear()

    @torch.inference_mode()
    def reset_decoder(self, slots: list[int]) -> None:
        """Endpoints: these streams' predictors start a new utterance; their encoder caches go on."""
        index = upload(self.device, slots)[0]
        for name, value in self._start.items():
            rows = self.pool.tensors[name]
            rows.index_copy_(0, index, value.to(rows.dtype).expand(len(slots), *value.shape))

    @torch.inference_mode()
    def step(self, batch: ChunkBatch, windows: list[np.ndarray]) -> ChunkTokens:
        """One chunk of every row of ``batch``; windows: each row's samples (``StreamAudio.window``).

        The step runs at the next power of two of rows (padding rows hold no audio and use the scratch slot):
        every new batch size would otherwise cost new cuFFT, cuDNN and cuBLAS plans in the middle of a live step,
        and on CUDA each (lookahead, size) has its forward captured as a graph.
        """
        self._clear_opened()
        geometry = self.geometry(batch.lookahead)
        rows = batch.rows
        size = 1 << (len(rows) - 1).bit_length()
        padding = size - len(rows)
        num_frames, past = geometry.feature_frames, geometry.past_frames
        frame = np.arange(num_frames)
        keep = [(frame >= r.lead_frames) & (frame < r.real_frames) for r in rows] + [frame < 0] * padding
        visible = [geometry.visible_past(r.chunk_index) for r in rows] + [0] * padding
        past_valid = [np.arange(past) >= past - n for n in visible]
        # The encoder frames of each row that hold audio: a whole chunk but for a stream's last, short one, whose
        # length the checkpoint's tail rule sets; a mask of fixed shape, so the step keeps its graph and batch.
        num_real = [self._real_frames(geometry, r) for r in rows] + [geometry.chunk_frames] * padding
        real = np.arange(geometry.chunk_frames)[None, :] < np.array(num_real)[:, None]
        slots, first, done, keep_t, past_t, real_t = upload(
            self.device, [r.slot for r in rows] + [self.scratch_slot] * padding,
            [r.chunk_index == 0 for r in rows] + [False] * padding,
            [r.chunk_index * geometry.chunk_frames for r in rows] + [0] * padding, np.stack(keep),
            np.stack(past_valid), real)
        windows = windows + [np.zeros_like(windows[0])] * padding
        inputs = dict(samples=upload_tensor(torch.from_numpy(np.stack(windows)), self.device), slots=slots,
                      first=first, frames_done=done, keep=keep_t.view(size, num_frames),
                      past_valid=past_t.view(size, past), real=real_t.view(size, geometry.chunk_frames))
        prompts = [r.prompt_id for r in rows]
        if any(p is not None for p in prompts):
            inputs["prompt_ids"] = upload(self.device, prompts + prompts[:1] * padding)[0]
        forward = functools.partial(self._encode, geometry)
        if self._graphs is None:
            frames, out, predictor = forward(**inputs)
        else:
            scratch = dict(inputs, slots=torch.full_like(slots, self.scratch_slot),
                           frames_done=torch.zeros_like(done))
            key = (batch.lookahead, size, "prompt_ids" in inputs)
            frames, out, predictor = self._graphs.run(key, forward, inputs, scratch)
        lengths = inputs["real"].sum(1)
        tokens = decode_chunk(self.model, frames, out, predictor, max_symbols=self.model.max_symbols_per_step,
                              lengths=lengths)
        self.pool.scatter(slots, self.model.predictor_rows(tokens.predictor_out, tokens.state))
        return ChunkTokens(tokens.token_ids[: len(rows)], tokens.token_frames[: len(rows)], tokens.predictor_out,
                           tokens.state)

    @staticmethod
    def _real_frames(geometry: StreamGeometry, row: ChunkRow) -> int:
        """Encoder frames of ``row``'s chunk that hold audio: a chunk short of feature frames is its stream's last
        (the scheduler cuts one only once the stream is closed), and the checkpoint's tail rule counts it."""
        if row.real_frames >= geometry.feature_frames:
            return geometry.chunk_frames
        return geometry.tail_frames(row.chunk_index == 0, row.real_frames - row.lead_frames)

    def _encode(self, geometry: StreamGeometry, samples: torch.Tensor, slots: torch.Tensor, first: torch.Tensor,
                frames_done: torch.Tensor, keep: torch.Tensor, past_valid: torch.Tensor, real: torch.Tensor,
                prompt_ids: torch.Tensor | None = None):
        """The step's forward up to the label loop, with fixed shapes and no host sync (a graph's body): the
        rows' feature frames, their encoder state from the pool and back to it, their projected frames and
        predictor context -> (frames [B, chunk_frames, H], predictor out, predictor state). frames_done: [B],
        the encoder frames each row's stream has made before this chunk (where its ring fields stand); real:
        bool [B, chunk_frames], the encoder frames that hold audio (``_real_frames``): attention sees no other."""
        mel = self.loaded.features.window_frames(samples).transpose(1, 2)  # [B, K, n_mels]
        mel = mel * keep.unsqueeze(2).to(mel.dtype)
        state = self.pool.gather(slots, frames_done)
        hidden, new_state = self.model.stream_encode(mel.to(self.loaded.dtype), state, first.bool(),
                                                     past_valid.bool(), geometry, real.bool())
        self.pool.scatter(slots, new_state)
        frames = self.model.project_encoder(self.model.fuse_prompt(hidden, prompt_ids))
        out, predictor = self.model.predictor_from_rows(state)
        return frames, out, predictor
