"""Batched offline transcription: inputs -> 30 s windows -> batches -> per-input results, in input order.

Audio longer than one window is cut into consecutive 30 s windows whose texts are joined; sequential long-form
decoding with timestamps (and VAD-cut parallel windows) replaces this naive cut later.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

from oasr.audio import SAMPLE_RATE, audio_duration, load_audio
from oasr.engine.whisper_session import WhisperSession
from oasr.errors import AudioDecodeError
from oasr.models.loader import LoadedModel
from oasr.types import Segment, Transcription, TranscribeOptions

AudioInput = str | os.PathLike | bytes | np.ndarray


@dataclass
class _Pending:
    source: str
    duration_s: float
    num_windows: int
    tokens: dict[int, list[int]] = field(default_factory=dict)
    languages: dict[int, str | None] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return len(self.tokens) == self.num_windows


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


class OfflineTranscriber:
    def __init__(self, loaded: LoadedModel, options: TranscribeOptions) -> None:
        self.loaded = loaded
        self.options = options
        self.session = WhisperSession(loaded, options)
        self.window = loaded.features.config.n_samples

    def run(self, inputs: Iterable[AudioInput]) -> Iterator[Transcription]:
        """Yields one result per input, in order; inputs that fail to decode yield a result with ``error``."""
        order: list[_Pending | Transcription] = []
        queue: list[tuple[_Pending, int, np.ndarray]] = []
        for index, item in enumerate(inputs):
            name = describe(item, index)
            try:
                samples = to_samples(item, name)
            except AudioDecodeError as exc:
                order.append(Transcription(source=name, text="", language=None, duration_s=0.0, error=str(exc)))
            else:
                windows = split_windows(samples, self.window)
                pending = _Pending(name, audio_duration(samples, SAMPLE_RATE), len(windows))
                order.append(pending)
                queue.extend((pending, i, w) for i, w in enumerate(windows))
            while len(queue) >= self.options.batch_size:
                self._run_batch(queue[: self.options.batch_size])
                del queue[: self.options.batch_size]
            yield from self._drain(order)
        if queue:
            self._run_batch(queue)
        yield from self._drain(order)

    def _run_batch(self, batch: list[tuple[_Pending, int, np.ndarray]]) -> None:
        results = self.session.decode_windows([w for _, _, w in batch])
        for (pending, window_index, _), result in zip(batch, results, strict=True):
            pending.tokens[window_index] = result.token_ids
            pending.languages[window_index] = result.language

    def _drain(self, order: list[_Pending | Transcription]) -> Iterator[Transcription]:
        while order and (isinstance(order[0], Transcription) or order[0].done):
            head = order.pop(0)
            yield head if isinstance(head, Transcription) else self._finish(head)

    def _finish(self, pending: _Pending) -> Transcription:
        tokenizer = self.loaded.tokenizer
        window_s = self.window / SAMPLE_RATE
        texts = [tokenizer.decode(pending.tokens[i]) for i in range(pending.num_windows)]
        segments = [
            Segment(start=i * window_s, end=min((i + 1) * window_s, pending.duration_s), text=text.strip())
            for i, text in enumerate(texts)
            if text.strip()
        ]
        return Transcription(
            source=pending.source,
            text="".join(texts).strip(),
            language=pending.languages[0],
            duration_s=round(pending.duration_s, 3),
            token_ids=[t for i in range(pending.num_windows) for t in pending.tokens[i]],
            segments=segments,
        )
