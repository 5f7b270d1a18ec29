"""The engine as the HTTP layer sees it: every host's client (``oasr.hosting.client.CoreClient`` in-process or
over ZeroMQ, ``oasr.hosting.ray_replicas.RayReplicaSet`` over Ray) is one. Tests may wrap any (to slow it down,
count aborts) without the server knowing."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol

import numpy as np

from oasr.diarization.types import SpeakerSegment
from oasr.hosting.live_stream import LiveStream
from oasr.engine.stats import EngineStats
from oasr.engine.request import BULK_PRIORITY, RequestOutput
from oasr.models.base import AlignmentRow
from oasr.models.capabilities import ModelCapabilities
from oasr.streaming.types import StreamOptions
from oasr.types import DecodeOptions, Word


class EngineClient(Protocol):
    tokenizer: Any  # read-only: the served model's tokenizer, which turns token ids into text

    @property
    def window_samples(self) -> int:
        """Samples in one decoding window (16 kHz); longer audio is cut into windows of this size."""

    @property
    def alive(self) -> bool:
        """False once the engine has stopped (its loop failed, its process exited): nothing can be served."""

    @property
    def state(self) -> str:
        """``ok`` while it serves, ``starting`` while a new engine core loads after the last one died, ``dead``."""

    @property
    def num_restarts(self) -> int:
        """Engine cores started again after the one before died."""

    @property
    def supports_word_timestamps(self) -> bool:
        """Whether ``align_words`` can answer (the model declares word timestamps)."""

    @property
    def capabilities(self) -> ModelCapabilities:
        """The served architecture's capability record."""

    async def check(self, options: DecodeOptions) -> None:
        """Raises ``UnsupportedOptionError`` for options the model cannot serve."""

    async def align_words(self, rows: Sequence[AlignmentRow], audio: Sequence[np.ndarray]) -> Sequence[Sequence[Word]]:
        """The words of one input's decoded windows, one row each (``oasr.transcription.words.alignment_rows``), from
        each window's audio; times from the input's start. Raises ``EngineDeadError`` when the engine has
        stopped."""

    def generate(self, audio: np.ndarray, options: DecodeOptions, *, partial: bool = True,
                 priority: int = BULK_PRIORITY) -> AsyncIterator[RequestOutput]:
        """One window's outputs: each new token with ``partial``, else only the last (``finished=True``).
        ``priority``: lower is scheduled sooner (``INTERACTIVE_PRIORITY`` for a live turn, the default for files).
        Closing the iterator early aborts the request and frees its rows. Raises ``EngineOverloadedError``
        when the queue is full, ``EngineDeadError`` when the engine has stopped."""

    def open_stream(self, options: StreamOptions) -> LiveStream:
        """A live stream, for a model whose ``capabilities.streaming`` names a runtime. Not awaited: a stream
        that cannot open (``StreamCapacityError``: every slot taken; an option refused) fails at its first
        event read. Raises ``EngineDeadError`` when the engine has stopped."""

    def stats(self) -> EngineStats:
        """A recent snapshot of the engine's queue, memory and batch sizes."""

    @property
    def diarization_model(self) -> str | None:
        """The diarization checkpoint the engine serves beside its model (``diarize``), or None."""

    async def diarize(self, audio: np.ndarray, threshold: float = 0.5) -> Sequence[SpeakerSegment]:
        """Who speaks when in ``audio`` (16 kHz), by ``diarization_model``. Raises ``UnsupportedOptionError``
        without one, ``EngineDeadError`` when the engine has stopped."""
