"""Offline transcription through the engine: inputs -> 30 s windows -> requests -> per-input results, in order.

Audio is decoded on worker threads ahead of the engine (libsndfile, FFmpeg and soxr release the GIL), so the
GPU is not left waiting on file I/O. With ``long_form="parallel"`` audio longer than one window is cut into
consecutive 30 s windows decoded independently and joined; ``"sequential"`` hands the inputs to
``oasr.engine.sequential`` (openai-whisper's seek loop).
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import numpy as np

from oasr.audio import SAMPLE_RATE, audio_duration, load_audio
from oasr.engine.config import EngineConfig
from oasr.engine.engine import ASREngine
from oasr.engine.request import RequestOutput
from oasr.engine.results import assemble, decoded_window
from oasr.engine.sequential import SequentialTranscriber
from oasr.errors import AudioDecodeError
from oasr.models.loader import LoadedModel
from oasr.types import DecodeOptions, Transcription, TranscribeOptions

AudioInput = str | os.PathLike | bytes | np.ndarray
_DECODE_THREADS = 4
_DECODE_LOOKAHEAD = 64


@dataclass
class _Pending:
    source: str
    duration_s: float
    num_windows: int
    outputs: dict[int, RequestOutput] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return len(self.outputs) == self.num_windows


def describe(item: AudioInput, index: int) -> str:
    if isinstance(item, (str, os.PathLike)):
        return str(item)
    return f"<input {index}>"


def to_samples(item: AudioInput, name: str) -> np.ndarray:
    if isinstance(item, np.ndarray):
        samples = np.asarray(item, dtype=np.float32).reshape(-1)
        if samples.size == 0:
            raise AudioDecodeError(name, "zero samples")
        return samples
    return load_audio(item, name=name)


def split_windows(samples: np.ndarray, window: int) -> list[np.ndarray]:
    return [samples[start : start + window] for start in range(0, len(samples), window)]


def engine_config_for(options: TranscribeOptions, base: EngineConfig | None = None) -> EngineConfig:
    """``batch_size`` bounds the windows decoding at once and the windows encoded per step."""
    base = base or EngineConfig()
    s = base.scheduler
    return replace(
        base,
        scheduler=replace(
            s,
            max_num_seqs=options.batch_size,
            max_encode_rows=min(s.max_encode_rows, options.batch_size),
            max_combined_encode_rows=min(s.max_combined_encode_rows, options.batch_size),
        ),
    )


class OfflineTranscriber:
    def __init__(self, loaded: LoadedModel, options: TranscribeOptions, config: EngineConfig | None = None) -> None:
        self.loaded = loaded
        self.options = options
        self.engine = ASREngine(loaded, engine_config_for(options, config))
        self.decode_options = DecodeOptions(language=options.language, task=options.task,
                                            timestamps=options.timestamps, prompt=options.prompt)
        self.engine.runner.check(self.decode_options)  # refuse what the model cannot do before reading any input
        self.window = self.engine.runner.window_samples

    def run(self, inputs: Iterable[AudioInput]) -> Iterator[Transcription]:
        """Yields one result per input, in input order; inputs that fail to decode yield a result with ``error``."""
        if self.options.long_form == "sequential":
            yield from SequentialTranscriber(self.loaded, self.engine, self.options).run(self._decoded(inputs))
            return
        order: deque[_Pending | Transcription] = deque()
        by_id: dict[str, tuple[_Pending, int]] = {}

        def requests() -> Iterator[tuple[str, np.ndarray, DecodeOptions]]:
            for index, name, samples in self._decoded(inputs):
                if isinstance(samples, AudioDecodeError):
                    order.append(Transcription(source=name, text="", language=None, duration_s=0.0, error=str(samples)))
                    continue
                windows = split_windows(samples, self.window)
                pending = _Pending(name, audio_duration(samples, SAMPLE_RATE), len(windows))
                order.append(pending)
                for w, window in enumerate(windows):
                    request_id = f"{index}/{w}"
                    by_id[request_id] = (pending, w)
                    yield request_id, window, self.decode_options

        for output in self.engine.run(requests()):
            pending, w = by_id.pop(output.request_id)
            pending.outputs[w] = output
            yield from self._drain(order)
        yield from self._drain(order)

    def _decoded(self, inputs: Iterable[AudioInput]) -> Iterator[tuple[int, str, np.ndarray | AudioDecodeError]]:
        def work(index: int, item: AudioInput) -> tuple[int, str, np.ndarray | AudioDecodeError]:
            name = describe(item, index)
            try:
                return index, name, to_samples(item, name)
            except AudioDecodeError as exc:
                return index, name, exc

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
        windows = []
        for i in range(pending.num_windows):
            out = pending.outputs[i]
            windows.append(decoded_window(self.loaded.tokenizer, i, self.window, pending.duration_s, out.token_ids,
                                          out.language, avg_logprob=out.avg_logprob,
                                          no_speech_prob=out.no_speech_prob))
        return assemble(pending.source, pending.duration_s, windows)
