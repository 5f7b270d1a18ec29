"""``Engine``: one model's whole-file requests and live streams behind one ``step()`` and one result type.

Whole files (30 s windows, or a model's own window) go through an ``ASREngine``; live streams, for a model whose
capability record names a streaming runtime, through a ``StreamingEngine``. Both are stepped by the same
``step``, which returns a ``StepResult`` of the requests that changed and the streams that moved. A streaming
model's ``ASREngine`` is built when first needed (its first whole-file request, or a look at the stats).

This is the object every host drives (``oasr.hosting``): the in-process thread, the engine-core process and a Ray
replica hand it the same messages and read the same results.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from oasr.engine.config import EngineConfig
from oasr.engine.engine import ASREngine
from oasr.engine.frame_runner import refuse_kv_cache_dtype
from oasr.engine.request import BULK_PRIORITY
from oasr.engine.stats import EngineStats
from oasr.engine.step import StepResult
from oasr.engine.streams import StreamingEngine
from oasr.models.capabilities import ModelCapabilities, capabilities_of
from oasr.models.loader import LoadedModel
from oasr.streaming.types import StreamingConfig, StreamingUnsupportedError, StreamOptions
from oasr.types import DecodeOptions


class Engine:
    def __init__(self, loaded: LoadedModel, config: EngineConfig | None = None,
                 streaming: StreamingConfig | None = None, *, live_streams: bool = True) -> None:
        """``streaming``: a streaming model's stream slots (None: ``StreamingConfig()``); ``live_streams``
        False serves whole files only (no stream slots are held)."""
        self.loaded = loaded
        self.capabilities: ModelCapabilities = capabilities_of(type(loaded.model))
        self.config = config
        self.streams: StreamingEngine | None = None
        if streaming is not None and streaming.final_model is not None and self.capabilities.streaming is None:
            raise StreamingUnsupportedError(
                f"final_model {streaming.final_model}: {loaded.name} does not stream, so it has no streamed "
                "utterances for a two-pass final (its whole-file transcripts are already final)")
        if live_streams and self.capabilities.streaming is not None:
            refuse_kv_cache_dtype(loaded, config)  # its whole files run the frame runner, built later
            self.streams = StreamingEngine(loaded, streaming or StreamingConfig())
        self._offline: ASREngine | None = None if self.streams is not None else ASREngine(loaded, config)

    @property
    def offline(self) -> ASREngine:
        """The engine whole files go through (a streaming model's is built when first needed)."""
        if self._offline is None:
            self._offline = ASREngine(self.loaded, self.config)
        return self._offline

    @property
    def window_samples(self) -> int:
        """The longest audio one whole-file request holds (16 kHz samples)."""
        return self.offline.runner.window_samples

    def check(self, options: DecodeOptions) -> None:
        """Raises ``UnsupportedOptionError`` for options the model cannot serve."""
        self.offline.runner.check(options)

    # -- whole files ----------------------------------------------------------------------------------------
    def add_request(self, audio: np.ndarray, options: DecodeOptions | None = None,
                    request_id: str | None = None, *, priority: int = BULK_PRIORITY) -> str:
        return self.offline.add_request(audio, options, request_id, priority=priority)

    def abort(self, request_id: str) -> None:
        if self._offline is not None:
            self._offline.abort(request_id)

    # -- live streams ---------------------------------------------------------------------------------------
    def stream_engine(self) -> StreamingEngine:
        if self.streams is None:
            raise StreamingUnsupportedError(
                f"{self.loaded.name} cannot stream: it declares no streaming runtime")
        return self.streams

    def open_stream(self, options: StreamOptions | None = None, stream_id: str | None = None) -> str:
        return self.stream_engine().open(options, stream_id)

    # -- the loop -------------------------------------------------------------------------------------------
    def has_unfinished(self) -> bool:
        """Whether any request is unfinished or any stream open."""
        return (self._offline is not None and self._offline.has_unfinished()) or \
            (self.streams is not None and self.streams.has_unfinished())

    def has_ready_work(self) -> bool:
        """Whether ``step`` would do anything now (open streams waiting for audio do not count)."""
        return (self._offline is not None and self._offline.has_unfinished()) or \
            (self.streams is not None and self.streams.has_ready_work())

    def step(self) -> StepResult:
        busy = self._offline is not None and self._offline.has_unfinished()
        outputs = self._offline.step() if busy else []
        if self.streams is None:
            return StepResult(outputs=outputs)
        streamed = self.streams.step()
        return replace(streamed, outputs=outputs)

    def stats(self) -> EngineStats:
        """The whole-file engine's numbers, with the streams open, the slots they may take and the two-pass
        final's numbers (where there is a final model)."""
        stats = self.offline.stats()
        if self.streams is None:
            return stats
        final_pass = self.streams.final_pass
        return replace(stats, num_streams=self.streams.num_streams, stream_slots=self.streams.config.max_streams,
                       final_pass=None if final_pass is None else final_pass.stats())
