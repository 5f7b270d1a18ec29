"""The engine as the HTTP layer sees it. ``oasr.engine.async_engine.AsyncEngine`` is the implementation;
tests may wrap it (to slow it down, count aborts) without the server knowing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

import numpy as np

from oasr.engine.engine import EngineStats
from oasr.engine.request import RequestOutput
from oasr.models.loader import LoadedModel
from oasr.types import DecodeOptions


class EngineClient(Protocol):
    loaded: LoadedModel  # read-only: the tokenizer and the model's name come from here

    @property
    def window_samples(self) -> int:
        """Samples in one decoding window (16 kHz); longer audio is cut into windows of this size."""

    def check(self, options: DecodeOptions) -> None:
        """Raises ``UnsupportedOptionError`` for options the model cannot serve."""

    def generate(self, audio: np.ndarray, options: DecodeOptions) -> AsyncIterator[RequestOutput]:
        """One window's outputs as tokens arrive (the last has ``finished=True``). Closing the iterator early
        aborts the request and frees its rows. Raises ``EngineOverloadedError`` when the queue is full."""

    def stats(self) -> EngineStats:
        """A recent snapshot of the engine's queue and memory."""
