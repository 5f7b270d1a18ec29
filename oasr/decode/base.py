"""The base every decode strategy registers under: what the engine reads of a strategy class."""

from __future__ import annotations

from typing import ClassVar


class DecodeStrategy:
    runner: ClassVar[str]  # the runner kind that drives it: "autoregressive" or "frame_sync"
    searches: ClassVar[bool] = False  # serves DecodeOptions.beam_size
    graph_capturable: ClassVar[bool] = False  # takes ``cuda_graphs=`` and replays captured steps

    @classmethod
    def for_beam(cls, beam_size: int) -> DecodeStrategy:
        """A searching strategy for requests of ``beam_size`` (frame-synchronous runners build one per size)."""
        raise NotImplementedError(f"{cls.__name__} does not search")
