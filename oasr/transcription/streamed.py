"""Whole files through the streaming path: each file becomes a stream, fed chunk by chunk as fast as the engine
takes it, and its events become the same ``Transcription`` offline decoding returns, one segment per utterance
(a file is one utterance unless endpointing is on). ``oasr transcribe --stream`` runs this; it shows what a live
client would get, and on a file it can be compared with the offline result. With ``final_model`` each
utterance's text is the two-pass final's (that model over the utterance's audio), and so are the token ids.

Files run side by side, as many as the engine has stream slots; a file that cannot be decoded yields a result
with ``error`` and costs the others nothing.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from oasr.audio import SAMPLE_RATE
from oasr.errors import AudioDecodeError
from oasr.models.loader import LoadedModel
from oasr.streaming.endpointing import EndpointConfig
from oasr.streaming.geometry import lookahead_for
from oasr.engine.streams import StreamEvent, StreamingConfig, StreamingEngine, StreamOptions
from oasr.transcription.spans import AudioInput, describe, to_samples
from oasr.types import Segment, Transcription


@dataclass(frozen=True)
class StreamTranscribeOptions:
    chunk_ms: int | None = None  # audio per chunk (lookahead + 1 encoder frames); None: the model's default
    language: str | None = None
    endpointing: EndpointConfig | None = None
    max_streams: int = 16  # files streamed at once
    final_model: str | None = None  # an offline model whose transcript of each utterance is its final text

    def __post_init__(self) -> None:
        if self.chunk_ms is not None and self.chunk_ms <= 0:
            raise ValueError(f"chunk_ms must be positive, got {self.chunk_ms}")


@dataclass
class _File:
    index: int
    name: str
    samples: np.ndarray
    position: int = 0
    segments: list[Segment] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)


class StreamTranscriber:
    def __init__(self, loaded: LoadedModel, options: StreamTranscribeOptions | None = None) -> None:
        self.loaded = loaded
        self.options = options or StreamTranscribeOptions()
        self.engine = StreamingEngine(loaded, StreamingConfig(max_streams=self.options.max_streams,
                                                              final_model=self.options.final_model))
        frame_seconds = self.engine.runtime.frame_seconds
        lookahead = None if self.options.chunk_ms is None else lookahead_for(self.options.chunk_ms, frame_seconds)
        self.stream_options = StreamOptions(lookahead=lookahead, language=self.options.language,
                                            endpointing=self.options.endpointing)
        # Validates the options (lookahead, language) before any file is read.
        self.engine.abort(self.engine.open(self.stream_options))
        geometry = self.engine.runtime.geometry(lookahead if lookahead is not None
                                                else self.engine.runtime.default_lookahead)
        self.push_samples = round(geometry.chunk_seconds * SAMPLE_RATE)

    def run(self, inputs: Sequence[AudioInput]) -> Iterator[Transcription]:
        """Yields one result per input, in input order."""
        pending = iter(enumerate(inputs))
        live: dict[str, _File] = {}
        done: dict[int, Transcription] = {}
        next_out, exhausted = 0, False
        while True:
            while not exhausted and self.engine.scheduler.num_free_slots:
                item = next(pending, None)
                if item is None:
                    exhausted = True
                    break
                index, source = item
                name = describe(source, index)
                try:
                    samples = to_samples(source, name)
                except AudioDecodeError as exc:
                    done[index] = Transcription(source=name, text="", language=None, duration_s=0.0, error=str(exc))
                    continue
                live[self.engine.open(self.stream_options)] = _File(index, name, samples)
            for stream_id, file in live.items():  # a chunk's worth of audio per stream per step
                if file.position < len(file.samples):
                    self.engine.push(stream_id, file.samples[file.position : file.position + self.push_samples])
                    file.position += self.push_samples
                    if file.position >= len(file.samples):
                        self.engine.close(stream_id)
            for event in self.engine.step().events:
                file = live[event.stream_id]
                self._collect(file, event)
                if event.closed:
                    done[file.index] = self._result(live.pop(event.stream_id))
            while next_out in done:
                yield done.pop(next_out)
                next_out += 1
            if exhausted and not live and not done:
                return

    def _collect(self, file: _File, event: StreamEvent) -> None:
        if self.engine.final_pass is None:
            file.token_ids.extend(event.new_token_ids)
        elif event.final:  # the final model's ids: the streamed ones are another tokenizer's
            file.token_ids.extend(event.token_ids)
        if event.final and (event.token_ids or not file.segments and event.closed):
            text = event.text.strip()
            file.segments.append(Segment(start=event.start_s, end=event.end_s, text=text,
                                         token_ids=event.token_ids))

    def _result(self, file: _File) -> Transcription:
        text = " ".join(s.text for s in file.segments if s.text)
        return Transcription(source=file.name, text=text, language=self.options.language,
                             duration_s=len(file.samples) / SAMPLE_RATE, token_ids=file.token_ids,
                             segments=file.segments)
