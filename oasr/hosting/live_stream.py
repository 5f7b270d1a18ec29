"""``LiveStream``: a stream opened through an engine client, seen from the caller's event loop. Torch-free (the
server's API processes hold them). Both engine clients make them; they differ only in how a message travels."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import numpy as np

from oasr.hosting.protocol import (
    STREAM_CAPACITY,
    UNSUPPORTED_OPTION,
    AbortStreams,
    CloseStream,
    PushAudio,
    StreamFailed,
)
from oasr.hosting.relay import EngineDeadError
from oasr.errors import OASRError, UnsupportedOptionError
from oasr.streaming.types import StreamCapacityError, StreamEvent


class LiveStream:
    """Push 16 kHz samples as they arrive, ``close`` at the end (or ``abort``); ``events()`` yields the stream's
    events in order, up to the one with ``closed``, and raises what the stream failed with (no free slot, an
    option the model refuses, the engine gone). Once it has failed, closed or been aborted, pushes are dropped."""

    def __init__(self, stream_id: str, send: Callable[[object, np.ndarray | None], None],
                 forget: Callable[[str], None]) -> None:
        self.stream_id = stream_id
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[StreamEvent | BaseException] = asyncio.Queue()
        self._send = send
        self._forget = forget
        self._over = False  # failed, closed or aborted

    def push(self, samples: np.ndarray) -> None:
        if not self._over and len(samples):
            self._send(PushAudio(self.stream_id), np.ascontiguousarray(samples, dtype=np.float32))

    def close(self) -> None:
        if not self._over:
            self._send(CloseStream(self.stream_id), None)

    def abort(self) -> None:
        """Frees the stream's slot now (a no-op once it is over)."""
        if not self._over:
            self._end()
            try:
                self._send(AbortStreams((self.stream_id,)), None)
            except EngineDeadError:  # a gone engine holds no slots
                pass

    async def events(self) -> AsyncIterator[StreamEvent]:
        while True:
            item = await self.queue.get()
            if isinstance(item, BaseException):
                self._end()
                raise item
            if item.closed:
                self._end()
            yield item
            if item.closed:
                return

    def _end(self) -> None:
        if not self._over:
            self._over = True
            self._forget(self.stream_id)


def stream_error(failure: StreamFailed) -> OASRError:
    """What a ``StreamFailed`` raises at the stream's reader."""
    if failure.kind == STREAM_CAPACITY:
        return StreamCapacityError(failure.message)
    if failure.kind == UNSUPPORTED_OPTION:
        return UnsupportedOptionError(failure.message)
    return OASRError(failure.message)
