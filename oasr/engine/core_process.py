"""The engine core in a process of its own: it loads the model, then runs the ``ASREngine`` step loop, taking
requests from the API process and handing back tokens, so that nothing the HTTP server does (parsing uploads,
decoding audio, answering) competes with the step loop for one interpreter lock.

Each loop iteration drains every message waiting on the input socket, runs one engine step, and sends one
``CoreUpdate`` with everything that came of both (new tokens, failures, option checks, changed stats).
"""

from __future__ import annotations

import logging
import os
import signal
import sys

import numpy as np
import zmq

from oasr.engine.core_protocol import (
    INVALID_REQUEST,
    UNSUPPORTED_OPTION,
    AbortRequests,
    AddRequest,
    CheckOptions,
    CheckResult,
    CoreFailed,
    CoreReady,
    CoreUpdate,
    EngineCoreSpec,
    EngineInfo,
    RequestFailed,
    StopCore,
    TokenDelta,
    dumps,
    loads,
)
from oasr.engine.engine import ASREngine, EngineStats
from oasr.engine.request import RequestOutput
from oasr.errors import OASRError, UnsupportedOptionError

log = logging.getLogger(__name__)
IDLE_POLL_MS = 500  # an idle core wakes this often to see whether the API process is still there


class EngineCore:
    """The loop's logic, apart from sockets: messages in, one ``CoreUpdate`` (or nothing) out per iteration."""

    def __init__(self, engine: ASREngine) -> None:
        self.engine = engine
        # Tokens already sent per live request; None for one that only wants its finished result.
        self._sent: dict[str, int | None] = {}
        self._failures: list[RequestFailed] = []
        self._checks: list[CheckResult] = []
        self._last_stats: EngineStats | None = None

    def info(self) -> EngineInfo:
        loaded = self.engine.loaded
        self._last_stats = self.engine.stats()
        return EngineInfo(loaded.name, str(loaded.device), self.engine.runner.window_samples, loaded.tokenizer,
                          self._last_stats)

    def handle(self, message: object, audio: np.ndarray | None = None) -> bool:
        """Acts on one message; returns False for ``StopCore``."""
        if isinstance(message, AddRequest):
            self._add(message, audio)
        elif isinstance(message, AbortRequests):
            for request_id in message.request_ids:
                self._sent.pop(request_id, None)
                self.engine.abort(request_id)
        elif isinstance(message, CheckOptions):
            try:
                self.engine.runner.check(message.options)
                self._checks.append(CheckResult(message.call_id, None))
            except UnsupportedOptionError as exc:
                self._checks.append(CheckResult(message.call_id, str(exc)))
        elif isinstance(message, StopCore):
            return False
        else:
            raise TypeError(f"unexpected message {type(message).__name__}")
        return True

    def _add(self, message: AddRequest, audio: np.ndarray | None) -> None:
        if audio is None:
            raise TypeError("AddRequest without its audio frame")
        try:
            self.engine.add_request(audio, message.options, request_id=message.request_id)
        except UnsupportedOptionError as exc:
            self._failures.append(RequestFailed(message.request_id, UNSUPPORTED_OPTION, str(exc)))
            return
        except OASRError as exc:
            self._failures.append(RequestFailed(message.request_id, INVALID_REQUEST, str(exc)))
            return
        self._sent[message.request_id] = 0 if message.partial else None

    def step(self) -> CoreUpdate | None:
        """Runs one engine step if there is work; returns what the API process has to hear, if anything."""
        outputs = self.engine.step() if self.engine.has_unfinished() else []
        deltas = tuple(d for d in map(self._delta, outputs) if d is not None)
        stats = self.engine.stats()
        changed = stats if stats != self._last_stats else None
        self._last_stats = stats
        if not (deltas or self._failures or self._checks or changed):
            return None
        update = CoreUpdate(deltas, tuple(self._failures), tuple(self._checks), changed)
        self._failures.clear()
        self._checks.clear()
        return update

    def _delta(self, output: RequestOutput) -> TokenDelta | None:
        if output.request_id not in self._sent:
            return None  # aborted by the API process; nobody is waiting for it
        sent = self._sent[output.request_id]
        if output.finished:
            del self._sent[output.request_id]
            # The whole list, from position 0: it is the truth even if a preempted request decoded differently.
            return TokenDelta(output.request_id, tuple(output.token_ids), output.language, True,
                              output.finish_reason, output.timings, output.sum_logprob, output.no_speech_prob)
        if sent is None or len(output.token_ids) <= sent:
            return None
        self._sent[output.request_id] = len(output.token_ids)
        return TokenDelta(output.request_id, tuple(output.token_ids[sent:]), output.language, False, None, None)


def run_engine_core(spec: EngineCoreSpec, input_address: str, output_address: str) -> None:
    """The core process's entry point (started with multiprocessing's 'spawn', so CUDA can be initialised)."""
    # Ctrl-C in a terminal reaches the whole process group; the API process decides when the core stops.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=spec.log_level, format="%(levelname)s %(name)s [engine core]: %(message)s")
    parent = os.getppid()
    context = zmq.Context()
    inbox = context.socket(zmq.PULL)
    outbox = context.socket(zmq.PUSH)
    for sock in (inbox, outbox):
        sock.setsockopt(zmq.RCVHWM if sock is inbox else zmq.SNDHWM, 0)  # admission bounds what is in flight
        sock.setsockopt(zmq.LINGER, 5000)  # a last CoreFailed still gets out
    inbox.connect(input_address)
    outbox.connect(output_address)
    try:
        try:
            core = EngineCore(_build_engine(spec))
        except BaseException as exc:
            outbox.send(dumps(CoreFailed(_describe(exc))))
            if not isinstance(exc, OASRError):
                log.exception("engine core failed to start")
            sys.exit(1)
        outbox.send(dumps(CoreReady(core.info())))
        try:
            _serve(core, inbox, outbox, parent)
        except BaseException as exc:  # the API process fails every waiting request when it sees this (or our exit)
            log.exception("engine core stopped")
            outbox.send(dumps(CoreFailed(_describe(exc))))
            sys.exit(1)
    finally:
        inbox.close(linger=0)
        outbox.close()
        context.term()


def _build_engine(spec: EngineCoreSpec) -> ASREngine:
    import torch

    from oasr.models.loader import from_pretrained

    if spec.cpu_threads is not None:
        torch.set_num_threads(spec.cpu_threads)

    loaded = from_pretrained(spec.model, device=spec.device, dtype=spec.dtype)
    return ASREngine(loaded, spec.config)


def _serve(core: EngineCore, inbox: zmq.Socket, outbox: zmq.Socket, parent: int) -> None:
    poller = zmq.Poller()
    poller.register(inbox, zmq.POLLIN)
    while True:
        if poller.poll(0 if core.engine.has_unfinished() else IDLE_POLL_MS):
            while True:  # every message waiting now: a burst of requests joins the next step together
                try:
                    frames = inbox.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                audio = np.frombuffer(frames[1].buffer, dtype=np.float32).copy() if len(frames) > 1 else None
                if not core.handle(loads(frames[0].buffer), audio):
                    return
        update = core.step()
        if update is not None:
            outbox.send(dumps(update), copy=False)
        if os.getppid() != parent:
            log.warning("the API process is gone; the engine core stops")
            return


def _describe(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, OASRError) else f"{type(exc).__name__}: {exc}"
