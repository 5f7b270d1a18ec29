"""``StreamingEngine``: live audio in, partial and final results out, a step at a time.

Open a stream (``StreamOptions``: the lookahead, the language, endpointing), push audio of any length whenever
it arrives, ``close`` when it ends (its last chunk is padded and decoded) or ``abort`` it (its slot is freed at
once, with no further events). Each ``step`` encodes one chunk of every ready stream of one lookahead in one
forward, and returns a ``StepResult`` with a ``StreamEvent`` per stream that moved: the tokens decided in that
step, and ``final`` at the end of an utterance (an endpoint, or the stream's end). Whole files beside the streams
are the combined ``Engine``'s (``oasr.engine.combined``), which steps both. With ``StreamingConfig.final_model``
an offline model beside the streaming one gives each utterance's final (``oasr.engine.final_pass``), stepped
in this engine's steps.

A model that cannot stream is refused when the engine is built. The options, events and errors live in the
torch-free ``oasr.streaming.types`` (the server's API processes read them) and are importable from here too.
"""

from __future__ import annotations

import itertools

import numpy as np

from oasr.engine.final_pass import FinalPass
from oasr.engine.step import StepResult
from oasr.errors import OASRError
from oasr.models.capabilities import capabilities_of, check_options
from oasr.models.loader import LoadedModel
from oasr.streaming import STREAMING_RUNTIMES
from oasr.streaming.endpointing import Endpointer
from oasr.streaming.scheduler import StreamRecord, StreamScheduler
from oasr.streaming.types import (
    StreamCapacityError,
    StreamEvent,
    StreamingConfig,
    StreamingUnsupportedError,
    StreamOptions,
)
from oasr.types import DecodeOptions


class StreamingEngine:
    def __init__(self, loaded: LoadedModel, config: StreamingConfig | None = None) -> None:
        self.loaded = loaded
        self.config = config or StreamingConfig()
        self.capabilities = capabilities_of(type(loaded.model))
        if self.capabilities.streaming is None:
            raise StreamingUnsupportedError(
                f"{loaded.name} ({loaded.architecture}) cannot stream: its encoder sees the whole input (no "
                f"streaming runtime is declared for it); use whole-file transcription, or a cache-aware "
                f"checkpoint such as nemotron_asr_streaming")
        self.runtime = STREAMING_RUNTIMES.get(self.capabilities.streaming)(loaded, self.config.max_streams,
                                                                           cuda_graphs=self.config.cuda_graphs)
        self.scheduler = StreamScheduler(self.config.max_streams, self.config.max_batch)
        if loaded.device.type == "cuda":
            for lookahead in self.config.warm_lookaheads or (self.runtime.default_lookahead,):
                self.runtime.warm_up(lookahead, min(self.config.max_streams, self.config.max_batch))
        self.final_pass = None if self.config.final_model is None else FinalPass.load(self.config.final_model, loaded)
        self._ids = itertools.count()

    # -- streams ------------------------------------------------------------------------------------------
    def open(self, options: StreamOptions | None = None, stream_id: str | None = None) -> str:
        options = options or StreamOptions()
        check_options(self.capabilities, DecodeOptions(language=options.language), self.loaded.name)
        lookahead = self.runtime.default_lookahead if options.lookahead is None else options.lookahead
        try:
            geometry = self.runtime.geometry(lookahead)
        except ValueError as error:
            raise OASRError(f"lookahead {lookahead}: {error}") from None
        stream_id = stream_id if stream_id is not None else f"stream-{next(self._ids)}"
        if stream_id in self.scheduler.streams:
            raise OASRError(f"stream id {stream_id!r} is already open")
        prompt = self.loaded.model.prompt_id(DecodeOptions(language=options.language))
        if self.final_pass is not None:
            self.final_pass.check(stream_id, options.language)
        slot = self.scheduler.take_slot()
        if slot is None:
            raise StreamCapacityError(f"all {self.config.max_streams} stream slots are taken")
        if self.final_pass is not None:
            self.final_pass.open(stream_id, options.language)
        endpointer = None if options.endpointing is None else Endpointer(options.endpointing, geometry.frame_seconds)
        self.runtime.open(slot)
        self.scheduler.add(StreamRecord(stream_id, slot, geometry, self.runtime.new_audio(), prompt, endpointer))
        return stream_id

    def push(self, stream_id: str, audio: np.ndarray) -> None:
        """Appends 16 kHz mono float samples to an open stream."""
        self._record(stream_id).audio.push(audio)
        if self.final_pass is not None:  # checked samples only: the buffer above refuses bad ones
            self.final_pass.push(stream_id, np.asarray(audio, dtype=np.float32))

    def close(self, stream_id: str) -> None:
        """No more audio: the stream's last chunk is decoded (padded) and its last event has ``closed``."""
        self._record(stream_id).audio.close()

    def abort(self, stream_id: str) -> None:
        """Ends a stream now: its slot is free for the next one and it gets no more events (a closed stream whose
        two-pass final is still being transcribed is aborted too)."""
        held = self.final_pass is not None and self.final_pass.abort(stream_id)
        if stream_id in self.scheduler.streams:
            self.scheduler.remove(stream_id)
        elif not held:
            self._record(stream_id)  # refuses it

    def _record(self, stream_id: str) -> StreamRecord:
        record = self.scheduler.streams.get(stream_id)
        if record is None:
            raise OASRError(f"no open stream {stream_id!r}")
        return record

    @property
    def num_streams(self) -> int:
        return len(self.scheduler.streams)

    # -- the loop -----------------------------------------------------------------------------------------
    def has_unfinished(self) -> bool:
        return bool(self.scheduler.streams) or self._finals_waiting()

    def has_ready_work(self) -> bool:
        """Whether ``step`` would do anything now; False while every open stream waits for audio (a loop that
        serves live streams waits for messages then, instead of stepping)."""
        return self.scheduler.has_ready() or self._finals_waiting()

    def _finals_waiting(self) -> bool:
        return self.final_pass is not None and self.final_pass.has_unfinished()

    def step(self) -> StepResult:
        events, chunks = self._stream_step()
        for stream_id in self.scheduler.exhausted():  # closed streams with nothing left to encode
            events += self._finish(self.scheduler.remove(stream_id), [], closed=True)
        if self.final_pass is not None:  # utterances that ended in this step are transcribed in it too
            events += self.final_pass.step()
        return StepResult(events=events, chunks=chunks)

    def _stream_step(self) -> tuple[list[StreamEvent], list[tuple[str, int]]]:
        batch = self.scheduler.schedule()
        if batch is None:
            return [], []
        records = [self.scheduler.streams[row.stream_id] for row in batch.rows]
        windows = [r.audio.window(row.first_frame, r.geometry.feature_frames) for r, row in zip(records, batch.rows)]
        decoded = self.runtime.step(batch, windows)
        events, resets = [], []
        for record, new, frames in zip(records, decoded.token_ids, decoded.token_frames, strict=True):
            record.num_chunks += 1
            record.audio.discard_before(record.chunk_range(record.num_chunks)[0])
            record.tokens.extend(new)
            endpoint = self._endpoint(record, frames)
            if endpoint is not None:
                events += self._finish(record, new, closed=False, endpoint=endpoint)
                resets.append(record.slot)
            elif new:
                events.append(self._event(record, new))
        if resets:
            self.runtime.reset_decoder(resets)
        return events, [(row.stream_id, row.chunk_index) for row in batch.rows]

    def _endpoint(self, record: StreamRecord, token_frames: list[int]) -> str | None:
        if record.endpointer is None:
            return None
        emitted = [False] * record.geometry.chunk_frames
        for frame in token_frames:
            emitted[frame] = True
        fired = record.endpointer.update(emitted)
        return None if fired is None else (fired.rule.name or f"rule{fired.rule_index + 1}")

    def _event(self, record: StreamRecord, new: list[int], **flags) -> StreamEvent:
        g = record.geometry
        # Encoder frame j stands for the audio from j frames on; the last chunk's padding runs past the end.
        end_s = record.encoded_frames * g.frame_seconds
        if record.audio.closed:
            end_s = min(end_s, record.audio.num_samples / self.runtime.sample_rate)
        return StreamEvent(record.stream_id, record.utterance, tuple(new), tuple(record.tokens),
                           self.loaded.tokenizer.decode(record.tokens), record.utterance_start_frame * g.frame_seconds,
                           end_s, **flags)

    def _finish(self, record: StreamRecord, new: list[int], *, closed: bool, endpoint: str | None = None
                ) -> list[StreamEvent]:
        """The utterance's final event; the stream starts its next utterance (or is over). With a two-pass
        final the event is held for it, and what stands in its place now is returned (a partial, or nothing)."""
        event = self._event(record, new, final=True, closed=closed, endpoint=endpoint)
        record.utterance += 1
        record.tokens = []
        record.utterance_start_frame = record.encoded_frames
        if self.final_pass is None:
            return [event]
        # The utterance ends where its last chunk does, in the samples the stream received.
        end_sample = round(record.encoded_frames * record.geometry.frame_seconds * self.runtime.sample_rate)
        partial = self.final_pass.end_utterance(event, end_sample)
        return [] if partial is None else [partial]
