"""The engine core in a process of its own: it loads the model, then runs the ``ASREngine`` step loop, taking
requests from the API process and handing back tokens, so that nothing the HTTP server does (parsing uploads,
decoding audio, answering) competes with the step loop for one interpreter lock. When the model's capability
record names a streaming runtime the loop runs a ``StreamingEngine`` instead: live streams (opened, fed, closed
and aborted by messages) beside whole-file requests, which go through its ``ASREngine`` in the same step.

Each loop iteration drains every message waiting on the input sockets, runs one engine step, and sends one
``CoreUpdate`` with everything that came of both (new tokens, failures, option checks, word alignments,
changed stats). A word alignment (``AlignWords``) runs when its message is handled, between two steps.

One core serves one or more clients (``oasr serve --api-workers N``: one per HTTP worker process), each over a
channel of its own (an input and an output socket). The core remembers which client added each request and
sends its tokens, failures, option checks and alignments to that client only; changed stats go to every
client. The same holds for streams; a client whose channel drops (its process died) has its streams aborted, so
their slots are free again.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from typing import TYPE_CHECKING

import numpy as np
import zmq

from oasr.engine.core_protocol import (
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
    CoreFailed,
    CoreReady,
    CoreUpdate,
    EngineCoreSpec,
    EngineInfo,
    OpenStream,
    PushAudio,
    RequestFailed,
    StopCore,
    TokenDelta,
    dumps,
    loads,
)
from oasr.engine.request import RequestOutput
from oasr.heap import HeapTrimmer, bound_heap
from oasr.engine.stats import EngineStats
from oasr.errors import OASRError, UnsupportedOptionError
from oasr.engine.stream_router import StreamRouter
from oasr.streaming.types import StreamEvent

if TYPE_CHECKING:
    from oasr.engine.engine import ASREngine
    from oasr.streaming.engine import StreamingEngine

log = logging.getLogger(__name__)
IDLE_POLL_MS = 500  # an idle core wakes this often to see whether the API process is still there
_GPU_CORE_CPU_THREADS = 2  # torch CPU threads of a core whose model runs on a GPU (unless the spec says)


class EngineCore:
    """The loop's logic, apart from sockets: messages in, one ``CoreUpdate`` (or nothing) out per iteration."""

    def __init__(self, engine: ASREngine | StreamingEngine) -> None:
        """``engine``: an ``ASREngine``, or a ``StreamingEngine`` (streams, and whole files through its own
        ``ASREngine``, ``self.engine`` then)."""
        from oasr.streaming.engine import StreamingEngine

        self.streaming = engine if isinstance(engine, StreamingEngine) else None
        self.engine: ASREngine = engine.offline if isinstance(engine, StreamingEngine) else engine
        self.streams = StreamRouter(self.streaming, self.engine.loaded.name)
        # Tokens already sent per live request; None for one that only wants its finished result.
        self._sent: dict[str, int | None] = {}
        self._owner: dict[str, int] = {}  # live request -> the client (channel index) that added it
        self._failures: list[tuple[int, RequestFailed]] = []
        self._checks: list[tuple[int, CheckResult]] = []
        self._alignments: list[tuple[int, AlignResult]] = []
        self._last_stats: EngineStats | None = None

    def info(self) -> EngineInfo:
        from oasr.transcription.words import supports_word_timestamps

        loaded = self.engine.loaded
        self._last_stats = self._stats()
        return EngineInfo(loaded.name, str(loaded.device), self.engine.runner.window_samples, loaded.tokenizer,
                          self._last_stats, supports_word_timestamps(loaded), self.engine.capabilities)

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
                self.engine.runner.check(message.options)
                self._checks.append((client, CheckResult(message.call_id, None)))
            except UnsupportedOptionError as exc:
                self._checks.append((client, CheckResult(message.call_id, str(exc))))
        elif isinstance(message, AlignWords):
            self._alignments.append((client, self._align(message, audio)))
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
            self.engine.add_request(audio, message.options, request_id=message.request_id)
        except UnsupportedOptionError as exc:
            self._failures.append((client, RequestFailed(message.request_id, UNSUPPORTED_OPTION, str(exc))))
            return
        except OASRError as exc:
            self._failures.append((client, RequestFailed(message.request_id, INVALID_REQUEST, str(exc))))
            return
        self._sent[message.request_id] = 0 if message.partial else None
        self._owner[message.request_id] = client

    # ------------------------------------------------------------------ streams

    def drop_client(self, client: int) -> None:
        """``client`` is gone (its channel dropped): its streams are aborted; nobody hears of them again."""
        self.streams.drop(client)

    @property
    def has_ready_work(self) -> bool:
        """Whether a step now would do anything (live streams waiting for audio do not count)."""
        if self.streaming is not None:
            return self.streaming.has_ready_work()
        return self.engine.has_unfinished()

    def _stats(self) -> EngineStats:
        return self.streaming.stats() if self.streaming is not None else self.engine.stats()

    def _step(self) -> tuple[list[RequestOutput], list[StreamEvent]]:
        if not self.has_ready_work:
            return [], []
        if self.streaming is None:
            return self.engine.step(), []
        result = self.streaming.step()
        return result.outputs, result.events

    # ------------------------------------------------------------------ word alignment

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
            return AlignResult(message.call_id, error_kind=INTERNAL_ERROR, error=_describe(exc))
        return AlignResult(message.call_id, tuple(tuple(row) for row in words))

    def step(self) -> CoreUpdate | None:
        """One step for a core with a single client (client 0): what it has to hear, if anything."""
        return self.step_all(1).get(0)

    def step_all(self, num_clients: int) -> dict[int, CoreUpdate]:
        """Runs one engine step if there is work; returns what each client has to hear (clients with nothing
        to hear are left out). Changed stats go to every one of the ``num_clients`` clients."""
        outputs, stream_events = self._step()
        deltas: dict[int, list[TokenDelta]] = {}
        for output in outputs:
            client = self._owner.get(output.request_id, 0)
            delta = self._delta(output)
            if delta is not None:
                deltas.setdefault(client, []).append(delta)
        events = self.streams.route(stream_events)
        stream_failures = self.streams.take_failures()
        stats = self._stats()
        changed = stats if stats != self._last_stats else None
        self._last_stats = stats
        clients = set(deltas) | set(events) | {c for c, _ in self._failures} | {c for c, _ in self._checks}
        clients |= {c for c, _ in self._alignments} | {c for c, _ in stream_failures}
        if changed is not None:
            clients |= set(range(num_clients))
        updates = {
            client: CoreUpdate(tuple(deltas.get(client, ())),
                               tuple(f for c, f in self._failures if c == client),
                               tuple(r for c, r in self._checks if c == client),
                               tuple(a for c, a in self._alignments if c == client), changed,
                               tuple(events.get(client, ())),
                               tuple(f for c, f in stream_failures if c == client))
            for client in sorted(clients)
        }
        self._failures.clear()
        self._checks.clear()
        self._alignments.clear()
        return updates

    def _delta(self, output: RequestOutput) -> TokenDelta | None:
        if output.request_id not in self._sent:
            return None  # aborted by the API process; nobody is waiting for it
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


def run_engine_core(spec: EngineCoreSpec, channels: tuple[tuple[str, str], ...]) -> None:
    """The core process's entry point (started with multiprocessing's 'spawn', so CUDA can be initialised).
    ``channels`` holds one (input address, output address) pair per client; the clients bind, the core
    connects."""
    bound_heap()
    # Ctrl-C in a terminal reaches the whole process group; the API process decides when the core stops.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=spec.log_level, format="%(levelname)s %(name)s [engine core]: %(message)s")
    parent = os.getppid()
    context = zmq.Context()
    inboxes, outboxes = [], []
    for input_address, output_address in channels:
        inbox = context.socket(zmq.PULL)
        outbox = context.socket(zmq.PUSH)
        inbox.setsockopt(zmq.RCVHWM, 0)  # admission bounds what is in flight
        outbox.setsockopt(zmq.SNDHWM, 0)
        outbox.setsockopt(zmq.LINGER, 5000)  # a last CoreFailed still gets out
        inbox.connect(input_address)
        outbox.connect(output_address)
        inboxes.append(inbox)
        outboxes.append(outbox)

    def tell_all(message: object) -> None:
        for outbox in outboxes:
            outbox.send(dumps(message))

    try:
        try:
            core = EngineCore(_build_engine(spec))
        except BaseException as exc:
            tell_all(CoreFailed(_describe(exc)))
            if not isinstance(exc, OASRError):
                log.exception("engine core failed to start")
            sys.exit(1)
        tell_all(CoreReady(core.info()))
        try:
            _serve(core, inboxes, outboxes, parent)
        except BaseException as exc:  # every client fails its waiting requests when it sees this (or our exit)
            log.exception("engine core stopped")
            tell_all(CoreFailed(_describe(exc)))
            sys.exit(1)
    finally:
        for inbox in inboxes:
            inbox.close(linger=0)
        for outbox in outboxes:
            outbox.close()
        context.term()


def _build_engine(spec: EngineCoreSpec) -> ASREngine | StreamingEngine:
    """The model's engine: a ``StreamingEngine`` when its capability record names a streaming runtime."""
    import torch

    from oasr.engine.engine import ASREngine
    from oasr.models.capabilities import capabilities_of
    from oasr.models.loader import from_pretrained
    from oasr.streaming.engine import StreamingConfig, StreamingEngine

    if spec.cpu_threads is not None:
        torch.set_num_threads(spec.cpu_threads)

    loaded = from_pretrained(spec.model, device=spec.device, dtype=spec.dtype, quantization=spec.quantization)
    if spec.cpu_threads is None and loaded.device.type == "cuda":
        # The GPU does the work; a pool of spinning CPU threads per step would only take cores from the HTTP
        # workers beside the core.
        torch.set_num_threads(min(_GPU_CORE_CPU_THREADS, torch.get_num_threads()))
    if capabilities_of(type(loaded.model)).streaming is not None:
        return StreamingEngine(loaded, spec.streaming or StreamingConfig(), spec.config)
    return ASREngine(loaded, spec.config)


def _serve(core: EngineCore, inboxes: list[zmq.Socket], outboxes: list[zmq.Socket], parent: int) -> None:
    poller = zmq.Poller()
    for inbox in inboxes:
        poller.register(inbox, zmq.POLLIN)
    # A client whose process dies leaves its streams open for good; its input channel dropping says so.
    monitors = [inbox.get_monitor_socket(zmq.EVENT_DISCONNECTED) for inbox in inboxes]
    for monitor in monitors:
        poller.register(monitor, zmq.POLLIN)
    trimmer = HeapTrimmer()  # requests' audio and results churn the heap; its free pages go back each second
    try:
        while True:
            trimmer.maybe_trim()
            ready = dict(poller.poll(0 if core.has_ready_work else IDLE_POLL_MS))
            for client, inbox in enumerate(inboxes):
                while inbox in ready:  # every message waiting now: a burst of requests joins the next step
                    try:
                        frames = inbox.recv_multipart(zmq.NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    audio = np.frombuffer(frames[1].buffer, dtype=np.float32).copy() if len(frames) > 1 else None
                    if not core.handle(loads(frames[0].buffer), audio, client):
                        return
            for client, monitor in enumerate(monitors):
                if monitor in ready and _drained(monitor):
                    log.warning("client %d's channel dropped; its streams are aborted", client)
                    core.drop_client(client)
            for client, update in core.step_all(len(outboxes)).items():
                outboxes[client].send(dumps(update), copy=False)
            if os.getppid() != parent:
                log.warning("the API process is gone; the engine core stops")
                return
    finally:
        for inbox, monitor in zip(inboxes, monitors, strict=True):
            inbox.disable_monitor()
            monitor.close(linger=0)


def _drained(monitor: zmq.Socket) -> bool:
    """Reads every event waiting on a socket monitor; whether there was one."""
    seen = False
    while True:
        try:
            monitor.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return seen
        seen = True


def _describe(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, OASRError) else f"{type(exc).__name__}: {exc}"
