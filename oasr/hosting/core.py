"""``EngineCore``: the one engine core. Typed messages in (``oasr.hosting.protocol``), one ``CoreUpdate`` per
client per step out; every host drives it through ``oasr.hosting.loop`` (a thread, a process, a Ray actor).

One core serves one or more clients (``oasr serve --api-workers N``: one per HTTP worker process), each known by
an index. The core remembers which client added each request and opened each stream, and sends its tokens,
failures, option checks, alignments and stream events to that client only; changed stats go to every client. A
client that drops (its process died) has its streams aborted, so their slots are free again. A word alignment
(``AlignWords``) runs when its message is handled, between two steps, and fails alone. With a diarization model
beside the model (``EngineCoreSpec.diarization_model``), the ``Diarize`` messages are batched by length
(``oasr.diarization.offline``: a row's result does not depend on its batch) and one batch runs before each step,
on the same device, so a burst of files to diarize does not stall the engine's requests and streams; a failed
batch fails its requests alone. A streaming model's two-pass final model
(``StreamingConfig.final_model`` in ``EngineCoreSpec.streaming``) is the engine's own: its streaming engine loads
it beside the model and steps it in the core's steps.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from typing import TYPE_CHECKING

import numpy as np

from oasr.engine.stats import EngineStats
from oasr.errors import OASRError, UnsupportedOptionError
from oasr.hosting.protocol import (
    INTERNAL_ERROR,
    INVALID_REQUEST,
    UNSUPPORTED_OPTION,
    AbortRequests,
    AbortStreams,
    AddRequest,
    AlignResult,
    AlignWords,
    CheckOptions,
    CheckResult,
    CloseStream,
    CoreUpdate,
    Diarize,
    DiarizeResult,
    EngineCoreSpec,
    EngineInfo,
    OpenStream,
    PushAudio,
    RequestFailed,
    StopCore,
    TokenDelta,
)
from oasr.hosting.streams import StreamRouter

if TYPE_CHECKING:
    from oasr.diarization.offline import OfflineDiarizer
    from oasr.engine.combined import Engine
    from oasr.engine.request import RequestOutput

log = logging.getLogger(__name__)
_GPU_CORE_CPU_THREADS = 2  # torch CPU threads of a core whose model runs on a GPU (unless the spec says)


class EngineCore:
    def __init__(self, engine: Engine, diarizer: OfflineDiarizer | None = None) -> None:
        self.engine = engine
        self.diarizer = diarizer
        self._to_diarize: list[tuple[int, Diarize, np.ndarray]] = []  # handled, not yet planned into batches
        self._diarize_batches: deque[list[tuple[int, Diarize, np.ndarray]]] = deque()
        self._diarizations: list[tuple[int, DiarizeResult]] = []
        self.streams = StreamRouter(engine.streams, engine.loaded.name)
        # Tokens already sent per live request; None for one that only wants its finished result.
        self._sent: dict[str, int | None] = {}
        self._owner: dict[str, int] = {}  # live request -> the client that added it
        self._failures: list[tuple[int, RequestFailed]] = []
        self._checks: list[tuple[int, CheckResult]] = []
        self._alignments: list[tuple[int, AlignResult]] = []
        self._last_stats: EngineStats | None = None

    def info(self) -> EngineInfo:
        from oasr.transcription.words import supports_word_timestamps

        loaded = self.engine.loaded
        self._last_stats = self.engine.stats()
        return EngineInfo(loaded.name, str(loaded.device), self.engine.window_samples, loaded.tokenizer,
                          self._last_stats, supports_word_timestamps(loaded), self.engine.capabilities, os.getpid(),
                          f"{type(self).__module__}.{type(self).__qualname__}",
                          self.diarizer.loaded.name if self.diarizer is not None else None)

    @property
    def has_ready_work(self) -> bool:
        """Whether a step now would do anything (live streams waiting for audio do not count)."""
        return self.engine.has_ready_work() or bool(self._to_diarize or self._diarize_batches)

    def handle(self, message: object, audio: np.ndarray | None = None, client: int = 0) -> bool:
        """Acts on one message from ``client``; returns False for ``StopCore``. Request ids must be unique
        across clients (each client prefixes its own)."""
        if isinstance(message, AddRequest):
            self._add(message, audio, client)
        elif isinstance(message, AbortRequests):
            for request_id in message.request_ids:
                self._sent.pop(request_id, None)
                self._owner.pop(request_id, None)
                self.engine.abort(request_id)
        elif isinstance(message, CheckOptions):
            try:
                self.engine.check(message.options)
                self._checks.append((client, CheckResult(message.call_id, None)))
            except OASRError as exc:  # a refused option, or a file it names that cannot be read
                self._checks.append((client, CheckResult(message.call_id, str(exc))))
        elif isinstance(message, AlignWords):
            self._alignments.append((client, self._align(message, audio)))
        elif isinstance(message, Diarize):
            if audio is None:
                raise TypeError("Diarize without its audio frame")
            self._to_diarize.append((client, message, audio))
        elif isinstance(message, (OpenStream, PushAudio, CloseStream, AbortStreams)):
            self.streams.handle(message, audio, client)
        elif isinstance(message, StopCore):
            return False
        else:
            raise TypeError(f"unexpected message {type(message).__name__}")
        return True

    def _add(self, message: AddRequest, audio: np.ndarray | None, client: int) -> None:
        if audio is None:
            raise TypeError("AddRequest without its audio frame")
        try:
            self.engine.add_request(audio, message.options, request_id=message.request_id,
                                    priority=message.priority)
        except UnsupportedOptionError as exc:
            self._failures.append((client, RequestFailed(message.request_id, UNSUPPORTED_OPTION, str(exc))))
            return
        except OASRError as exc:
            self._failures.append((client, RequestFailed(message.request_id, INVALID_REQUEST, str(exc))))
            return
        self._sent[message.request_id] = 0 if message.partial else None
        self._owner[message.request_id] = client

    def drop_client(self, client: int) -> None:
        """``client`` is gone (its channel dropped): its streams are aborted and its files to diarize dropped;
        nobody hears of them again."""
        self.streams.drop(client)
        self._to_diarize = [waiting for waiting in self._to_diarize if waiting[0] != client]
        kept = ([waiting for waiting in batch if waiting[0] != client] for batch in self._diarize_batches)
        self._diarize_batches = deque(batch for batch in kept if batch)

    def _align(self, message: AlignWords, audio: np.ndarray | None) -> AlignResult:
        """Answers one ``AlignWords``. It fails alone: a request's words are not worth the core's life."""
        if audio is None or len(audio) != sum(message.num_samples):
            raise TypeError("AlignWords without its audio frame, or with a frame of another length")
        from oasr.transcription.words import align_windows

        windows = np.split(audio, np.cumsum(message.num_samples)[:-1])
        try:
            words = align_windows(self.engine.loaded, message.rows, windows)
        except UnsupportedOptionError as exc:
            return AlignResult(message.call_id, error_kind=UNSUPPORTED_OPTION, error=str(exc))
        except Exception as exc:
            log.exception("word alignment failed")
            return AlignResult(message.call_id, error_kind=INTERNAL_ERROR, error=describe(exc))
        return AlignResult(message.call_id, tuple(tuple(row) for row in words))

    def step(self) -> CoreUpdate | None:
        """One step for a core with a single client (client 0): what it has to hear, if anything."""
        return self.step_all(1).get(0)

    def step_all(self, num_clients: int) -> dict[int, CoreUpdate]:
        """Runs one engine step if there is work; returns what each client has to hear (clients with nothing
        to hear are left out). Changed stats go to every one of the ``num_clients`` clients."""
        self._diarize()
        result = self.engine.step() if self.engine.has_ready_work() else None
        deltas: dict[int, list[TokenDelta]] = {}
        for output in result.outputs if result is not None else ():
            client = self._owner.get(output.request_id, 0)
            delta = self._delta(output)
            if delta is not None:
                deltas.setdefault(client, []).append(delta)
        events = self.streams.route(result.events if result is not None else [])
        stream_failures = self.streams.take_failures()
        stats = self.engine.stats()
        changed = stats if stats != self._last_stats else None
        self._last_stats = stats
        clients = set(deltas) | set(events) | {c for c, _ in self._failures} | {c for c, _ in self._checks}
        clients |= {c for c, _ in self._alignments} | {c for c, _ in stream_failures}
        clients |= {c for c, _ in self._diarizations}
        if changed is not None:
            clients |= set(range(num_clients))
        updates = {
            client: CoreUpdate(tuple(deltas.get(client, ())),
                               tuple(f for c, f in self._failures if c == client),
                               tuple(r for c, r in self._checks if c == client),
                               tuple(a for c, a in self._alignments if c == client), changed,
                               tuple(events.get(client, ())),
                               tuple(f for c, f in stream_failures if c == client),
                               tuple(d for c, d in self._diarizations if c == client))
            for client in sorted(clients)
        }
        self._diarizations.clear()
        self._failures.clear()
        self._checks.clear()
        self._alignments.clear()
        return updates

    def _diarize(self) -> None:
        """One batch of the waiting ``Diarize`` messages. Those handled since the last plan are cut into batches
        by length (``OfflineDiarizer.batches``), queued behind the batches already planned; each step runs one,
        so the engine steps between them and messages handled later never overtake earlier ones."""
        if not self._diarize_batches and self._to_diarize:
            waiting, self._to_diarize = self._to_diarize, []
            if self.diarizer is None:
                self._diarizations += [(client, DiarizeResult(m.call_id, error_kind=UNSUPPORTED_OPTION,
                                                              error="this engine core serves no diarization model"))
                                       for client, m, _ in waiting]
                return
            plan = self.diarizer.batches([len(audio) for _, _, audio in waiting])
            self._diarize_batches.extend([waiting[i] for i in rows] for rows in plan)
        if not self._diarize_batches:
            return
        batch = self._diarize_batches.popleft()
        from oasr.diarization.segments import speaker_segments

        try:
            probs = self.diarizer.run([audio for _, _, audio in batch])
        except Exception as exc:
            log.exception("diarization failed")
            self._diarizations += [(client, DiarizeResult(m.call_id, error_kind=INTERNAL_ERROR, error=describe(exc)))
                                   for client, m, _ in batch]
            return
        frame_s = self.diarizer.loaded.frame_seconds
        self._diarizations += [(client, DiarizeResult(m.call_id, speaker_segments(rows, frame_s, m.threshold)))
                               for (client, m, _), rows in zip(batch, probs, strict=True)]

    def _delta(self, output: RequestOutput) -> TokenDelta | None:
        if output.request_id not in self._sent:
            return None  # aborted by its client; nobody is waiting for it
        sent = self._sent[output.request_id]
        if output.finished:
            del self._sent[output.request_id]
            self._owner.pop(output.request_id, None)
            # The whole list, from position 0: it is the truth even if a preempted request decoded differently.
            return TokenDelta(output.request_id, tuple(output.token_ids), output.language, True,
                              output.finish_reason, output.timings, output.sum_logprob, output.no_speech_prob)
        if sent is None or len(output.token_ids) <= sent:
            return None
        self._sent[output.request_id] = len(output.token_ids)
        return TokenDelta(output.request_id, tuple(output.token_ids[sent:]), output.language, False, None, None)


def build_engine(spec: EngineCoreSpec, *, live_streams: bool = True) -> Engine:
    """Loads ``spec.model`` and builds its engine, as every host does it (torch's CPU threads set first)."""
    import torch

    from oasr.engine.combined import Engine
    from oasr.models.loader import from_pretrained
    from oasr.transcription.offline import calibration_feed

    if spec.cpu_threads is not None:
        torch.set_num_threads(spec.cpu_threads)
    loaded = from_pretrained(spec.model, device=spec.device, dtype=spec.dtype, quantization=spec.quantization,
                             calibration_feed=calibration_feed)
    if spec.cpu_threads is None and loaded.device.type == "cuda":
        # The GPU does the work; a pool of spinning CPU threads per step would only take cores from the HTTP
        # workers beside the core.
        torch.set_num_threads(min(_GPU_CORE_CPU_THREADS, torch.get_num_threads()))
    return Engine(loaded, spec.config, spec.streaming, live_streams=live_streams)


def build_diarizer(spec: EngineCoreSpec) -> OfflineDiarizer | None:
    """``spec.diarization_model`` loaded on the model's device, or None without one."""
    if spec.diarization_model is None:
        return None
    from oasr.diarization.loader import load_diarizer
    from oasr.diarization.offline import OfflineDiarizer

    return OfflineDiarizer(load_diarizer(spec.diarization_model, device=spec.device))


def describe(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, OASRError) else f"{type(exc).__name__}: {exc}"
