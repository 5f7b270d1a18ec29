"""The engine core in a process of its own (``oasr serve``'s default): it loads the model, then runs the one core
loop (``oasr.hosting.loop``) over ZeroMQ sockets, so that nothing the HTTP server does (parsing uploads, decoding
audio, answering) competes with the step loop for one interpreter lock.

Each client (one per HTTP worker process) has a channel of its own: an input and an output socket, which the
client binds and the core connects to. The core says ``CoreReady`` (or ``CoreFailed``) on every channel once it
has loaded, then one ``CoreUpdate`` per loop iteration that had anything to say, and ``CoreFailed`` if the loop
dies. A channel that drops (its client's process died) has its streams aborted. When the process that started
the core is gone, the core stops and removes its socket directory, which nobody else would.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
from pathlib import Path

import numpy as np
import zmq

from oasr.errors import OASRError
from oasr.heap import bound_heap
from oasr.hosting.core import EngineCore, build_diarizer, build_engine, describe
from oasr.hosting.loop import Envelope, run_core
from oasr.hosting.protocol import CoreFailed, CoreReady, EngineCoreSpec, dumps, loads

log = logging.getLogger(__name__)


class ZmqInbox:
    """The core's input sockets, one per client, and a monitor on each that tells when its client went away."""

    def __init__(self, inboxes: list[zmq.Socket]) -> None:
        self._inboxes = inboxes
        self._poller = zmq.Poller()
        for inbox in inboxes:
            self._poller.register(inbox, zmq.POLLIN)
        self._monitors = [inbox.get_monitor_socket(zmq.EVENT_DISCONNECTED) for inbox in inboxes]
        for monitor in self._monitors:
            self._poller.register(monitor, zmq.POLLIN)
        self._ready: dict = {}

    def receive(self, timeout_s: float) -> list[Envelope]:
        self._ready = dict(self._poller.poll(int(timeout_s * 1000)))
        received = []
        for client, inbox in enumerate(self._inboxes):
            while inbox in self._ready:  # every message waiting now: a burst of requests joins the next step
                try:
                    frames = inbox.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                audio = np.frombuffer(frames[1].buffer, dtype=np.float32).copy() if len(frames) > 1 else None
                received.append(Envelope(client, loads(frames[0].buffer), audio))
        return received

    def dropped(self) -> list[int]:
        dropped = [client for client, monitor in enumerate(self._monitors)
                   if monitor in self._ready and _drained(monitor)]
        for client in dropped:
            log.warning("client %d's channel dropped; its streams are aborted", client)
        return dropped

    def close(self) -> None:
        for inbox, monitor in zip(self._inboxes, self._monitors, strict=True):
            inbox.disable_monitor()
            monitor.close(linger=0)


def run_engine_core(spec: EngineCoreSpec, channels: tuple[tuple[str, str], ...]) -> None:
    """The core process's entry point (started with multiprocessing's 'spawn', so CUDA can be initialised).
    ``channels`` holds one (input address, output address) pair per client."""
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

    def parent_alive() -> bool:
        return os.getppid() == parent

    orphaned = False
    try:
        try:
            core = EngineCore(build_engine(spec), build_diarizer(spec))
        except BaseException as exc:
            tell_all(CoreFailed(describe(exc)))
            if not isinstance(exc, OASRError):
                log.exception("engine core failed to start")
            sys.exit(1)
        tell_all(CoreReady(core.info()))
        inbox = ZmqInbox(inboxes)
        try:
            run_core(core, inbox, lambda client, update: outboxes[client].send(dumps(update), copy=False),
                     len(outboxes), keep_going=parent_alive)
            orphaned = not parent_alive()
            if orphaned:
                log.warning("the API process is gone; the engine core stops")
        except BaseException as exc:  # every client fails its waiting requests when it sees this (or our exit)
            log.exception("engine core stopped")
            tell_all(CoreFailed(describe(exc)))
            sys.exit(1)
        finally:
            inbox.close()
    finally:
        for socket in inboxes + outboxes:
            socket.close(linger=0 if socket in inboxes else None)
        context.term()
        if orphaned:  # nobody is left to remove the sockets' directory
            _remove_socket_directory(channels)


def _remove_socket_directory(channels: tuple[tuple[str, str], ...]) -> None:
    for address in {a for pair in channels for a in pair}:
        if address.startswith("ipc://"):
            shutil.rmtree(Path(address.removeprefix("ipc://")).parent, ignore_errors=True)


def _drained(monitor: zmq.Socket) -> bool:
    """Reads every event waiting on a socket monitor; whether there was one."""
    seen = False
    while True:
        try:
            monitor.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return seen
        seen = True
