"""Stream messages (``protocol``'s ``OpenStream``, ``PushAudio``, ``CloseStream``, ``AbortStreams``) applied to the
engine's ``StreamingEngine``, remembering which client owns each stream: the engine core's bookkeeping for live
streams. Failures are kept for the core to hand out with its next update; a stream's events go to its owner
until the one that closes it."""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING

import numpy as np

from oasr.hosting.protocol import (
    INVALID_REQUEST,
    STREAM_CAPACITY,
    UNSUPPORTED_OPTION,
    AbortStreams,
    CloseStream,
    OpenStream,
    PushAudio,
    StreamFailed,
)
from oasr.errors import OASRError, UnsupportedOptionError
from oasr.streaming.types import StreamCapacityError, StreamEvent

if TYPE_CHECKING:
    from oasr.engine.streams import StreamingEngine

StreamMessage = OpenStream | PushAudio | CloseStream | AbortStreams


class StreamRouter:
    def __init__(self, engine: StreamingEngine | None, model_name: str) -> None:
        """``engine`` None: the served model cannot stream, and every ``OpenStream`` fails."""
        self.engine = engine
        self.model_name = model_name
        self.owners: dict[str, Hashable] = {}  # open stream -> the client that opened it
        self.failures: list[tuple[Hashable, StreamFailed]] = []  # since the loop last took them

    def handle(self, message: StreamMessage, audio: np.ndarray | None, owner: Hashable) -> None:
        if isinstance(message, AbortStreams):
            for stream_id in message.stream_ids:
                if self.owners.pop(stream_id, None) is not None:
                    self.engine.abort(stream_id)
        elif isinstance(message, OpenStream):
            self._open(message, owner)
        elif message.stream_id in self.owners:  # else it failed or was aborted: what follows is moot
            try:
                if isinstance(message, PushAudio):
                    if audio is None:
                        raise ValueError("PushAudio without its audio frame")
                    self.engine.push(message.stream_id, audio)
                else:
                    self.engine.close(message.stream_id)
            except (OASRError, ValueError) as exc:  # bad samples, or audio after the close: the stream ends
                self._fail(message.stream_id, INVALID_REQUEST, str(exc))

    def _open(self, message: OpenStream, owner: Hashable) -> None:
        if self.engine is None:
            self.failures.append((owner, StreamFailed(
                message.stream_id, INVALID_REQUEST, f"{self.model_name} cannot stream: it declares no streaming "
                "runtime")))
            return
        try:
            self.engine.open(message.options, stream_id=message.stream_id)
        except StreamCapacityError as exc:
            self.failures.append((owner, StreamFailed(message.stream_id, STREAM_CAPACITY, str(exc))))
        except UnsupportedOptionError as exc:
            self.failures.append((owner, StreamFailed(message.stream_id, UNSUPPORTED_OPTION, str(exc))))
        except OASRError as exc:
            self.failures.append((owner, StreamFailed(message.stream_id, INVALID_REQUEST, str(exc))))
        else:
            self.owners[message.stream_id] = owner

    def _fail(self, stream_id: str, kind: str, error: str) -> None:
        owner = self.owners.pop(stream_id)
        self.engine.abort(stream_id)
        self.failures.append((owner, StreamFailed(stream_id, kind, error)))

    def drop(self, owner: Hashable) -> None:
        """``owner`` is gone: its streams are aborted, their slots free, and nobody hears of them again."""
        for stream_id in [s for s, o in self.owners.items() if o == owner]:
            del self.owners[stream_id]
            self.engine.abort(stream_id)

    def route(self, events: list[StreamEvent]) -> dict[Hashable, list[StreamEvent]]:
        """One step's events by owner; a closed stream is forgotten."""
        routed: dict[Hashable, list[StreamEvent]] = {}
        for event in events:
            owner = self.owners.get(event.stream_id)
            if owner is None:
                continue
            routed.setdefault(owner, []).append(event)
            if event.closed:
                del self.owners[event.stream_id]
        return routed

    def take_failures(self) -> list[tuple[Hashable, StreamFailed]]:
        failures, self.failures = self.failures, []
        return failures
