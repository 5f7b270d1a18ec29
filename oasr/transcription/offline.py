"""Offline transcription through the engine: inputs -> 30 s windows -> requests -> per-input results, in order.

Audio is decoded on worker threads ahead of the engine (libsndfile, FFmpeg and soxr release the GIL), so the
GPU is not left waiting on file I/O. With ``long_form="parallel"`` audio longer than one window is cut into
consecutive 30 s windows, or, with ``TranscribeOptions.vad``, into windows cut at the silences a VAD detector
finds (``oasr.vad.planner``; planned on the same worker threads), all decoded in one batch and joined. A window
whose decode stops short is continued by follow-up requests (``oasr.transcription.parallel``), added to the
engine while ``run`` feeds it, so they share its batches with the windows still coming;
``"sequential"`` hands the inputs to ``oasr.transcription.sequential`` (openai-whisper's seek loop).
"""

from __future__ import annotations

import itertools
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import numpy as np

from oasr.audio import SAMPLE_RATE, audio_duration, load_audio
from oasr.engine.config import EngineConfig
from oasr.engine.engine import ASREngine
from oasr.transcription.parallel import CoverPlan, WindowCover, cover_plan, window_covers
from oasr.transcription.punctuation import TranscriptPunctuator, punctuator_for
from oasr.transcription.results import DecodedWindow, assemble, timestamp_begin_of, with_words
from oasr.transcription.sequential import SequentialTranscriber
from oasr.errors import AudioDecodeError, UnsupportedOptionError
from oasr.models.capabilities import ModelCapabilities, capabilities_of
from oasr.models.loader import LoadedModel
from oasr.transcription.spans import (  # noqa: F401 (Span and to_samples: offline's names too)
    AudioInput, Span, SpanPlanner, describe, fixed_spans, long_audio_detector, split_windows, to_samples)
from oasr.types import DecodeOptions, Transcription, TranscribeOptions, word_search_fields

_DECODE_THREADS = 4
_DECODE_LOOKAHEAD = 64

# on_progress(found_s, done_s): an input was decoded (found_s: its seconds of audio), or a part of one finished
# (done_s: its seconds), so that a progress bar moves within one long input, not only once per input.
ProgressCallback = Callable[[float, float], None]


def no_progress(found_s: float, done_s: float) -> None:
    """The ``ProgressCallback`` that reports nowhere."""


def calibration_feed(loaded: LoadedModel, inputs: Iterable[AudioInput]) -> None:
    """Transcribes ``inputs`` with the default options and drops the text: the ``CalibrationFeed`` quantization
    calibrates through (``oasr.quantization.smooth``), handed to it by whoever loads or quantizes a model."""
    for result in OfflineTranscriber(loaded, TranscribeOptions()).run(list(inputs), no_progress):
        if result.error:
            raise ValueError(f"calibration input {result.source}: {result.error}")


@dataclass
class _Pending:
    source: str
    duration_s: float
    covers: list[WindowCover]
    audio: list[np.ndarray] = field(default_factory=list)  # the windows' samples, kept only for word timestamps

    @property
    def done(self) -> bool:
        return all(cover.done for cover in self.covers)


def engine_config_for(options: TranscribeOptions, base: EngineConfig | None = None) -> EngineConfig:
    """``batch_size`` bounds the windows decoding at once and the windows encoded per step; with beam search
    each window decodes on ``beam_size`` rows."""
    base = base or EngineConfig()
    s = base.scheduler
    return replace(
        base,
        scheduler=replace(
            s,
            max_num_seqs=options.batch_size * (options.beam_size or 1),
            max_encode_rows=min(s.max_encode_rows, options.batch_size),
            max_combined_encode_rows=min(s.max_combined_encode_rows, options.batch_size),
        ),
    )


class OfflineTranscriber:
    def __init__(self, loaded: LoadedModel, options: TranscribeOptions, config: EngineConfig | None = None) -> None:
        if options.word_timestamps and not capabilities_of(type(loaded.model)).word_timing:
            raise UnsupportedOptionError(f"{loaded.name} ({loaded.architecture}) cannot give word timestamps")
        self.loaded = loaded
        self.options = options
        self.engine = ASREngine(loaded, engine_config_for(options, config))
        self.decode_options = DecodeOptions(language=options.language, task=options.task,
                                            target_language=options.target_language,
                                            punctuation=options.punctuation,
                                            timestamps=options.timestamps, prompt=options.prompt,
                                            beam_size=options.beam_size, patience=options.patience,
                                            length_penalty=options.length_penalty,
                                            **word_search_fields(options))
        self.engine.runner.check(self.decode_options)  # refuse what the model cannot do before reading any input
        self.window = self.engine.runner.window_samples
        self.long_form_timestamps = self._serves_timestamps()
        detector = long_audio_detector(capabilities_of(type(loaded.model)), options.vad)
        self.span_planner = SpanPlanner(detector, self.window, loaded.device)
        # punctuation added after decoding (``TranscribeOptions.punctuate``), beside the model on its device
        self.punctuator: TranscriptPunctuator | None = punctuator_for(
            options.punctuate, capabilities_of(type(loaded.model)), loaded.name, str(loaded.device),
            punctuation=options.punctuation)

    def spans(self, samples: np.ndarray) -> list[Span]:
        """Where to cut one input (``SpanPlanner``)."""
        return self.span_planner(samples)

    def _serves_timestamps(self) -> bool:
        """Whether long inputs can be decoded with timestamps, which tell where a window's decode stopped."""
        if timestamp_begin_of(self.loaded.tokenizer) is None:
            return False
        try:
            self.engine.runner.check(replace(self.decode_options, timestamps=True))
        except UnsupportedOptionError:
            return False
        return True

    def cover_plan(self, num_windows: int) -> CoverPlan:
        return cover_plan(self.loaded.tokenizer, self.decode_options, self.options.fallback, num_windows=num_windows,
                          serves_timestamps=self.long_form_timestamps,
                          condition_on_previous_text=self.options.condition_on_previous_text)

    def run(self, inputs: Iterable[AudioInput], on_progress: ProgressCallback = no_progress) -> Iterator[Transcription]:
        """Yields one result per input, in input order; inputs that fail to decode yield a result with ``error``.
        ``on_progress`` hears of each input's audio when it is decoded and of each window when it is covered."""
        if self.options.long_form == "sequential":
            decoded = ((index, name, samples) for index, name, samples, _ in self._decoded(inputs))
            results = SequentialTranscriber(self.loaded, self.engine, self.options).run(decoded, on_progress)
            for result in results:
                yield self.punctuator.transcriptions([result])[0] if self.punctuator else result
            return
        order: deque[_Pending | Transcription] = deque()
        by_id: dict[str, WindowCover] = {}
        ids = itertools.count()

        def request(cover: WindowCover) -> tuple[str, np.ndarray, DecodeOptions] | None:
            piece = cover.next_request()
            if piece is None:
                return None
            request_id = f"{cover.index}/{next(ids)}"
            by_id[request_id] = cover
            return request_id, cover.samples[piece.start : piece.end], piece.options

        def requests() -> Iterator[tuple[str, np.ndarray, DecodeOptions]]:
            for index, name, samples, spans in self._decoded(inputs):
                if isinstance(samples, AudioDecodeError):
                    order.append(Transcription(source=name, text="", language=None, duration_s=0.0, error=str(samples)))
                    continue
                covers = window_covers(self.loaded.tokenizer, spans, samples, self.cover_plan(len(spans)))
                pending = _Pending(name, audio_duration(samples, SAMPLE_RATE), covers)
                if self.options.word_timestamps:
                    pending.audio = [samples[start:end] for start, end in spans]
                order.append(pending)
                on_progress(len(samples) / SAMPLE_RATE, 0.0)
                yield from filter(None, map(request, covers))

        for output in self.engine.run(requests()):
            cover = by_id.pop(output.request_id)
            cover.accept(output)
            follow_up = request(cover)
            if follow_up is not None:  # ``run`` keeps stepping while the engine has work, ours included
                self.engine.add_request(follow_up[1], follow_up[2], request_id=follow_up[0])
            else:
                on_progress(0.0, (cover.end - cover.start) / SAMPLE_RATE)
            yield from self._drain(order)
        yield from self._drain(order)

    def _decoded(
        self, inputs: Iterable[AudioInput]
    ) -> Iterator[tuple[int, str, np.ndarray | AudioDecodeError, list[Span]]]:
        def work(index: int, item: AudioInput) -> tuple[int, str, np.ndarray | AudioDecodeError, list[Span]]:
            name = describe(item, index)
            try:
                samples = to_samples(item, name)
            except AudioDecodeError as exc:
                return index, name, exc, []
            return index, name, samples, self.spans(samples)

        with ThreadPoolExecutor(_DECODE_THREADS, thread_name_prefix="oasr-audio") as pool:
            ahead: deque[Future] = deque()
            for index, item in enumerate(inputs):
                ahead.append(pool.submit(work, index, item))
                if len(ahead) >= _DECODE_LOOKAHEAD:
                    yield ahead.popleft().result()
            while ahead:
                yield ahead.popleft().result()

    def _drain(self, order: deque[_Pending | Transcription]) -> Iterator[Transcription]:
        while order and (isinstance(order[0], Transcription) or order[0].done):
            head = order.popleft()
            yield head if isinstance(head, Transcription) else self._finish(head)

    def _finish(self, pending: _Pending) -> Transcription:
        windows = [cover.result() for cover in pending.covers]
        if self.options.word_timestamps:
            windows = self._with_words(windows, pending.audio)
        if self.punctuator is not None:
            windows = self.punctuator.windows(windows)
        return assemble(pending.source, pending.duration_s, windows)

    def _with_words(self, windows: list[DecodedWindow], audio: list[np.ndarray]) -> list[DecodedWindow]:
        """Aligns each window's tokens to its audio (all windows of the input batched; each window's encoder
        output is computed again, as the engine has freed it by now)."""
        from oasr.transcription.words import align_windows, alignment_rows

        rows = alignment_rows(windows, audio, self.options.task, self.loaded.features.config.n_samples)
        words = align_windows(self.loaded, rows, audio)
        return [with_words(w, tuple(ws)) for w, ws in zip(windows, words, strict=True)]
