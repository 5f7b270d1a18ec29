"""Live diarization: streams of audio in, each chunk's speaker probabilities and the finished speaker segments
out, one step at a time.

Each stream holds its speaker cache and FIFO in slots of a ``StreamStatePool`` (the fields the model declares,
``stream_state_fields``); the counts of filled frames (which follow from the chunk sizes alone) stay on the host
in the stream's record. A step runs one chunk of every ready stream; streams whose caches hold the same number
of frames, and whose chunks have the same size, share one forward (streams opened together stay together).

This is its own engine object, beside ``oasr.engine``'s ``StreamingEngine``: that one drives transducer decoding
(tokens, text, endpointing) through a capability record and ``StreamGeometry``'s one-frame-plus-lookahead
chunks, none of which a diarization model has (docs/diarization.md).
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import torch

from oasr.diarization.loader import LoadedDiarizer
from oasr.diarization.stream_plan import PlannedChunk, StreamMode, plan_chunk
from oasr.diarization.tracker import SegmentTracker
from oasr.diarization.types import SpeakerSegment
from oasr.errors import OASRError
from oasr.streaming.audio import StreamAudio
from oasr.streaming.state_pool import StreamStatePool
from oasr.streaming.types import StreamCapacityError


@dataclass(frozen=True)
class DiarizationEvent:
    """What one step decided for one stream. ``probs``: [frames, speakers] of the frames scored in this step,
    from ``start_s``; ``segments``: the speaker segments that ended in them (all still open at the end, when
    ``closed``)."""

    stream_id: str
    start_s: float
    probs: np.ndarray
    segments: tuple[SpeakerSegment, ...]
    closed: bool = False


@dataclass
class _Stream:
    stream_id: str
    slot: int
    mode: StreamMode
    audio: StreamAudio
    tracker: SegmentTracker
    num_chunks: int = 0
    num_cache: int = 0  # filled frames of the slot's speaker cache and FIFO (host copies)
    num_fifo: int = 0
    compressed: bool = False
    planned: PlannedChunk | None = field(default=None, repr=False)


class DiarizationStreams:
    def __init__(self, loaded: LoadedDiarizer, max_streams: int = 64, threshold: float = 0.5) -> None:
        self.loaded, self.model, self.threshold = loaded, loaded.model, threshold
        self.max_streams = max_streams
        features = loaded.features.config
        self._audio_args = (features.hop_length, features.n_fft, features.preemphasis)
        config = loaded.config
        self.modes = {name: StreamMode(name, chunk, lookahead, config.audio_config.subsampling_factor,
                                       features.hop_length, features.n_fft, features.win_length, features.sample_rate)
                      for name, (chunk, lookahead) in config.streaming_modes.items()}
        self.default_mode = config.default_streaming_mode
        self.pool = StreamStatePool(self.model.stream_state_fields(), max_streams, loaded.device, loaded.dtype)
        self.streams: dict[str, _Stream] = {}
        self._free = list(range(max_streams - 1, -1, -1))
        self._ids = itertools.count()

    def open(self, mode: str | None = None, stream_id: str | None = None) -> str:
        mode = mode or self.default_mode
        if mode not in self.modes:
            raise OASRError(f"unknown streaming mode {mode!r}; this model has {', '.join(self.modes)}")
        stream_id = stream_id if stream_id is not None else f"diarization-{next(self._ids)}"
        if stream_id in self.streams:
            raise OASRError(f"stream id {stream_id!r} is already open")
        if not self._free:
            raise StreamCapacityError(f"all {self.max_streams} diarization stream slots are taken")
        slot = self._free.pop()
        with torch.inference_mode():
            self.pool.clear(torch.tensor([slot], device=self.loaded.device))
        tracker = SegmentTracker(self.loaded.config.num_speakers, self.loaded.frame_seconds, self.threshold)
        self.streams[stream_id] = _Stream(stream_id, slot, self.modes[mode], StreamAudio(*self._audio_args), tracker)
        return stream_id

    def push(self, stream_id: str, audio: np.ndarray) -> None:
        self._stream(stream_id).audio.push(audio)

    def close(self, stream_id: str) -> None:
        self._stream(stream_id).audio.close()

    def abort(self, stream_id: str) -> None:
        self._release(self._stream(stream_id))

    def _stream(self, stream_id: str) -> _Stream:
        if stream_id not in self.streams:
            raise OASRError(f"no open diarization stream {stream_id!r}")
        return self.streams[stream_id]

    def _release(self, stream: _Stream) -> None:
        del self.streams[stream.stream_id]
        self._free.append(stream.slot)

    def has_unfinished(self) -> bool:
        return bool(self.streams)

    def step(self) -> list[DiarizationEvent]:
        """One chunk of every ready stream; a closed stream with nothing left gets its last event."""
        groups: dict[tuple, list[_Stream]] = defaultdict(list)
        events = []
        for stream in list(self.streams.values()):
            a = stream.audio
            stream.planned = plan_chunk(stream.mode, stream.num_chunks, a.num_samples, a.closed)
            if stream.planned is not None:
                key = (stream.num_cache, stream.num_fifo, stream.compressed, stream.planned.num_frames,
                       stream.planned.lookahead)
                groups[key].append(stream)
            elif a.closed:
                events.append(self._finish(stream, np.zeros((0, self.loaded.config.num_speakers), np.float32)))
        for members in groups.values():
            events.extend(self._run(members))
        return events

    @torch.inference_mode()
    def _run(self, members: list[_Stream]) -> list[DiarizationEvent]:
        device, first = self.loaded.device, members[0]
        chunk = first.planned
        slots = torch.tensor([s.slot for s in members], device=device)
        windows = np.stack([s.audio.window(s.planned.first_frame, chunk.num_frames) for s in members])
        mel = self.loaded.features.window_frames(torch.from_numpy(windows).to(device)).transpose(1, 2)
        rows = self.pool.gather(slots)
        state = self.model.stream_state(rows, first.num_cache, first.num_fifo, first.compressed)
        logits, new_state = self.model.stream_step(state, mel, chunk.lookahead, chunk.num_frames)
        self.pool.scatter(slots, self.model.stream_rows(new_state))
        probs = logits.float().sigmoid().cpu().numpy()
        events = []
        for stream, row in zip(members, probs):
            planned = stream.planned
            stream.num_chunks += 1
            stream.num_cache, stream.num_fifo = new_state.num_cache, new_state.num_fifo
            stream.compressed = new_state.compressed
            stream.audio.discard_before(planned.first_frame + stream.mode.step_mel_frames)
            start_s = planned.first_frame * self.loaded.frame_seconds
            if planned.last:
                events.append(self._finish(stream, row, start_s))
            else:
                events.append(DiarizationEvent(stream.stream_id, start_s, row, tuple(stream.tracker.update(row))))
        return events

    def _finish(self, stream: _Stream, probs: np.ndarray, start_s: float | None = None) -> DiarizationEvent:
        segments = stream.tracker.update(probs) + stream.tracker.close()
        self._release(stream)
        if start_s is None:
            start_s = stream.tracker.num_frames * self.loaded.frame_seconds
        return DiarizationEvent(stream.stream_id, start_s, probs, tuple(segments), closed=True)
