"""``oasr serve --ray-replicas N``: N engine cores, each in a Ray actor of its own, behind the one HTTP server.

Ray is one more transport to the one engine core. Every replica (``EngineReplica``) loads the model and runs the
core loop on a thread of its actor (``oasr.hosting.inproc.CoreThread``); the server's process reaches it with the
core's typed messages (``send``) and reads its ``CoreUpdate``s from one streaming call (``updates``), through a
``CoreClient`` per replica: the same client as the other hosts, so whole files, word alignment, option checks and
live streams (``/v1/realtime``) work as with one engine, and the capability record is the model's own.
``RayReplicaSet`` is the ``EngineClient`` over them: each request, and each stream, goes to the replica with the
fewest in flight, and stays there.

- A replica that dies fails its requests and streams in flight with ``ReplicaLostError`` (503, retry); the others
  go on. Ray restarts its process (``MAX_REPLICA_RESTARTS``), the model loads again, and it is sent requests once it
  answers. An engine whose step loop failed ends its own process, so that it is restarted the same way.
- Each replica's numbers come with its updates: /metrics shows them summed and per replica.

Ray is an optional dependency (``pip install 'oasr[ray]'``): this module imports it only when a set starts.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import threading
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from oasr.engine.config import EngineConfig
from oasr.engine.request import BULK_PRIORITY, RequestOutput
from oasr.engine.stats import EngineStats, FinalPassStats, ReplicaStats
from oasr.errors import OASRError
from oasr.hosting.client import CoreClient
from oasr.hosting.live_stream import LiveStream
from oasr.hosting.protocol import CoreFailed, CoreUpdate, EngineCoreSpec, EngineInfo
from oasr.hosting.relay import EngineOverloadedError, ReplicaLostError
from oasr.models.capabilities import ModelCapabilities
from oasr.streaming.types import StreamOptions
from oasr.types import DecodeOptions, Word

log = logging.getLogger(__name__)
RAY_MISSING = "--ray-replicas needs Ray, which is not installed: pip install 'oasr[ray]'"
# Restarts of one replica before it stays down: a server outlives many single crashes, but a model that kills
# its process each time it loads should not be loaded forever.
MAX_REPLICA_RESTARTS = 16
HEARTBEAT_S = 0.5  # an idle replica's update stream says "nothing" this often, so its reader can stop
STARTUP_TIMEOUT_S = 1800.0  # for every replica to load its model (a large checkpoint on a cold disk is slow)
RETRY_S = 0.5  # how often a restarting replica is asked whether it is up
STOP_WAIT_S = 10.0


class ReplicaStartupError(OASRError):
    """A replica could not load its model, or the replicas did not all start in time."""


@dataclass(frozen=True)
class ReplicaOptions:
    """How many replicas, where, and what each reserves."""

    num_replicas: int
    address: str | None = None  # an existing cluster ("auto", "ray://host:10001", ...); None starts a local one
    gpus_per_replica: float = 0.0  # GPUs each replica reserves (fractions share a GPU)

    def __post_init__(self) -> None:
        if self.num_replicas < 1:
            raise ValueError(f"--ray-replicas must be >= 1 (got {self.num_replicas})")
        if self.gpus_per_replica < 0:
            raise ValueError(f"--gpus-per-replica must be >= 0 (got {self.gpus_per_replica})")


class EngineReplica:
    """A Ray actor holding one engine core, run by the one core loop on a thread of its own (``CoreThread``).
    The replica set sends it the core's typed messages (``send``, numbered: an async actor may start two calls in
    another order than they were made) and reads every ``CoreUpdate`` through one streaming call (``updates``)."""

    def __init__(self, spec: EngineCoreSpec) -> None:
        from oasr.heap import bound_heap
        from oasr.hosting.core import EngineCore, build_engine
        from oasr.hosting.inproc import CoreThread

        bound_heap()
        logging.basicConfig(level=spec.log_level, format="%(levelname)s %(name)s [replica]: %(message)s")
        self._updates: queue.SimpleQueue = queue.SimpleQueue()  # from the core's thread
        self._loop: Any = None  # the actor's event loop, once ``updates`` runs on it
        self._wake: Any = None  # an asyncio.Event on that loop, set when an update comes
        self._next_seq = 0
        self._held: dict[int, tuple[object, np.ndarray | None]] = {}  # messages that came before their turn
        self._failed: str | None = None
        core = EngineCore(build_engine(spec))
        self._info = core.info()
        self._thread = CoreThread(core, self._take, self._lost)
        self._thread.start()

    async def info(self) -> EngineInfo:
        if self._failed is not None:  # on its way out (Ray starts it again): not ready for anyone
            raise RuntimeError(f"the replica's engine stopped: {self._failed}")
        return self._info

    async def send(self, seq: int, message: object, audio: np.ndarray | None) -> None:
        # Ray hands over a read-only view of its object store; a copy of our own lets that go at once.
        self._held[seq] = (message, None if audio is None else np.array(audio, dtype=np.float32))
        while self._next_seq in self._held:
            message, audio = self._held.pop(self._next_seq)
            self._next_seq += 1
            self._thread.send(message, audio)

    async def updates(self):
        """Every update of the core, in order; ``None`` as a heartbeat while there is none, so the reader can
        look whether it should stop."""
        import asyncio

        self._wake = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        while True:
            taken = False
            while True:
                try:
                    update = self._updates.get_nowait()
                except queue.Empty:
                    break
                taken = True
                yield update
            if taken:
                continue
            try:
                await asyncio.wait_for(self._wake.wait(), HEARTBEAT_S)
                self._wake.clear()
            except asyncio.TimeoutError:
                yield None

    def _take(self, update: object) -> None:
        self._updates.put(update)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._wake.set)

    def _lost(self, reason: str) -> None:
        # The step loop failed (logged there): nothing more can be served from this process. Its reader hears
        # why, then the process ends, and Ray starts the replica again with a fresh engine.
        self._failed = reason
        self._take(CoreFailed(reason))
        threading.Timer(1.0, os._exit, (1,)).start()


class _RayTransport:
    """A ``CoreClient``'s transport to one replica: numbered ``send`` calls, fire and forget."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor
        self.up = True
        self._seq = itertools.count()
        self._lock = threading.Lock()

    def send(self, message: object, audio: np.ndarray | None = None) -> None:
        if not self.up:
            raise ReplicaLostError("this engine replica is down just now (restarting)")
        with self._lock:  # numbers in the order the calls are made
            self.actor.send.remote(next(self._seq), message, audio)

    def core_alive(self) -> bool:
        return self.up

    def describe_exit(self) -> str:
        return "replica stopped"

    def restarted(self) -> None:
        with self._lock:
            self._seq = itertools.count()
            self.up = True


@dataclass
class _Replica:
    """The server's view of one replica: its client, and what it was routed (under the set's lock)."""

    replica_id: int
    actor: Any  # its Ray actor handle
    transport: _RayTransport
    client: CoreClient
    num_requests: int = 0
    num_in_flight: int = 0

    @property
    def up(self) -> bool:
        return self.client.alive

    def snapshot(self) -> ReplicaStats:
        return ReplicaStats(self.replica_id, self.up, self.num_requests, self.num_in_flight, self.client.stats())


def final_pass_sum(replicas: Sequence[ReplicaStats]) -> FinalPassStats | None:
    """The replicas' two-pass finals as one (None: they have no final model). What is held and queued now is
    that of the replicas up; the finals sent are every replica's count, as the step counts are."""
    every = [r.engine.final_pass for r in replicas if r.engine.final_pass is not None]
    if not every:
        return None
    up = [r.engine.final_pass for r in replicas if r.up and r.engine.final_pass is not None]
    return FinalPassStats(sum(p.num_waiting for p in up), sum(p.num_completed for p in every),
                          sum(p.num_fallbacks for p in every), sum(p.num_requests_waiting for p in up),
                          sum(p.num_requests_running for p in up))


class RayReplicaSet:
    """An ``EngineClient`` over ``options.num_replicas`` engine replicas on Ray."""

    def __init__(self, spec: EngineCoreSpec, options: ReplicaOptions, *, max_waiting: int = 1024,
                 startup_timeout_s: float = STARTUP_TIMEOUT_S) -> None:
        """Joins or starts the cluster and waits for every replica to load its model."""
        import ray

        from oasr.scale.cluster import connect

        self.max_waiting = max_waiting
        self._started_ray = connect(options.address, options.num_replicas, log_to_driver=True,
                                    keep_signal_handlers=True)
        actor_class = ray.remote(EngineReplica).options(
            num_cpus=1, num_gpus=options.gpus_per_replica or None, max_restarts=MAX_REPLICA_RESTARTS,
            max_task_retries=0)  # a request in flight on a replica that dies fails (503), it is not rerun
        actors = [actor_class.remote(spec) for _ in range(options.num_replicas)]
        try:
            infos = self._wait_ready(spec, actors, startup_timeout_s)
        except BaseException:
            self._stop(actors)
            raise
        self.info = infos[0]
        self.tokenizer = self.info.tokenizer
        self._replicas = []
        for i, (actor, info) in enumerate(zip(actors, infos, strict=True)):
            transport = _RayTransport(actor)
            client = CoreClient(info, transport, max_waiting=max_waiting, id_prefix=f"r{i}-")
            self._replicas.append(_Replica(i, actor, transport, client))
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._readers = [threading.Thread(target=self._read, args=(r,), name=f"oasr-replica-{r.replica_id}",
                                          daemon=True) for r in self._replicas]
        for reader in self._readers:
            reader.start()

    # ------------------------------------------------------------------ the engine-client interface

    @property
    def window_samples(self) -> int:
        return self.info.window_samples

    @property
    def alive(self) -> bool:
        """While at least one replica answers (none up, all restarting or dead, reads as unhealthy)."""
        return any(r.up for r in self._replicas)

    @property
    def state(self) -> str:
        return "ok" if self.alive else "starting"

    @property
    def num_restarts(self) -> int:
        return sum(r.client.num_restarts for r in self._replicas)

    @property
    def supports_word_timestamps(self) -> bool:
        return self.info.supports_word_timestamps

    @property
    def capabilities(self) -> ModelCapabilities:
        return self.info.capabilities

    def stats(self) -> EngineStats:
        """The replicas' numbers summed (the load of those up, the step counts of all), and each one's own."""
        with self._lock:
            replicas = tuple(r.snapshot() for r in self._replicas)
        up = [r.engine for r in replicas if r.up]
        first = replicas[0].engine
        encode, decode = first.encode_batch_sizes, first.decode_batch_sizes
        for r in replicas[1:]:
            encode, decode = encode + r.engine.encode_batch_sizes, decode + r.engine.decode_batch_sizes
        return EngineStats(sum(s.num_waiting for s in up), sum(s.num_running for s in up),
                           sum(s.kv_blocks_used for s in up), sum(s.kv_blocks_total for s in up),
                           sum(s.num_slots for s in up), encode, decode, sum(s.num_streams for s in up),
                           sum(s.stream_slots for s in up), final_pass=final_pass_sum(replicas), replicas=replicas)

    async def check(self, options: DecodeOptions) -> None:
        await self._acquire(count=False).client.check(options)

    async def align_words(self, rows: Sequence, audio: Sequence[np.ndarray]) -> Sequence[Sequence[Word]]:
        return await self._acquire(count=False).client.align_words(rows, audio)

    @property
    def diarization_model(self) -> str | None:
        return self.info.diarization_model  # replicas load none: the API process runs its own

    async def diarize(self, audio: np.ndarray, threshold: float = 0.5):
        return await self._acquire(count=False).client.diarize(audio, threshold)

    async def generate(self, audio: np.ndarray, options: DecodeOptions, *, partial: bool = True,
                       priority: int = BULK_PRIORITY) -> AsyncIterator[RequestOutput]:
        """This request's outputs from the least-loaded replica, at ``priority`` there. Leaving early aborts it
        there."""
        replica = self._acquire(count=True)
        try:
            async for output in replica.client.generate(audio, options, partial=partial, priority=priority):
                yield output
        finally:
            with self._lock:
                replica.num_in_flight -= 1

    def open_stream(self, options: StreamOptions) -> LiveStream:
        """A live stream on the least-loaded replica, for its whole life."""
        return self._acquire(count=False).client.open_stream(options)

    def shutdown(self) -> None:
        """Stops the readers and the replicas; shuts Ray down if this set started it."""
        if self._closing.is_set():
            return
        self._closing.set()
        for reader in self._readers:
            reader.join(timeout=STOP_WAIT_S)
        for replica in self._replicas:
            replica.client.fail_all("the engine replicas were shut down")
        self._stop([r.actor for r in self._replicas])

    # ------------------------------------------------------------------ routing

    def _acquire(self, *, count: bool) -> _Replica:
        """The up replica with the fewest requests in flight (then the fewest so far); ``count``: one more in
        flight on it, which the caller gives back."""
        with self._lock:
            up = [r for r in self._replicas if r.up]
            if not up:
                raise ReplicaLostError("no engine replica is up just now (restarting)")
            if count and sum(r.num_in_flight for r in self._replicas) >= self.max_waiting:
                raise EngineOverloadedError(f"{self.max_waiting} requests in flight; try again later")
            replica = min(up, key=lambda r: (r.num_in_flight, r.num_requests))
            if count:
                replica.num_in_flight += 1
                replica.num_requests += 1
            return replica

    # ------------------------------------------------------------------ each replica's reader thread

    def _read(self, replica: _Replica) -> None:
        """Hands the replica's updates to its client; when it dies, fails what it held and waits for Ray to
        bring it back."""
        import ray
        from ray.exceptions import RayError

        while not self._closing.is_set():
            try:
                for ref in replica.actor.updates.remote():
                    update = ray.get(ref)
                    if self._closing.is_set():
                        return
                    if isinstance(update, CoreFailed):
                        raise RuntimeError(update.message)
                    if update is not None:
                        replica.client.dispatch(update)
            except (RayError, RuntimeError) as exc:
                if self._closing.is_set():
                    return
                replica.transport.up = False
                log.error("engine replica %d is down (%s); the others serve until it is back", replica.replica_id,
                          str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
                replica.client.fail_all(f"engine replica {replica.replica_id} stopped; retry the request",
                                        ReplicaLostError, restarting=True)
                info = self._wait_back(replica)
                if info is None:
                    return
                replica.transport.restarted()
                replica.client.restarted(info)
                log.warning("engine replica %d is up again", replica.replica_id)

    def _wait_back(self, replica: _Replica) -> EngineInfo | None:
        """The restarted replica's info once it answers; None when the set closes (or the replica is gone)."""
        import ray
        from ray.exceptions import RayError

        while not self._closing.is_set():
            try:
                return ray.get(replica.actor.info.remote(), timeout=RETRY_S * 10)
            except RayError:  # still restarting, or on its way out; one past its restarts stays down
                self._closing.wait(RETRY_S)
        return None

    # ------------------------------------------------------------------ start and stop

    @staticmethod
    def _wait_ready(spec: EngineCoreSpec, actors: list, timeout_s: float) -> list[EngineInfo]:
        import ray
        from ray.exceptions import GetTimeoutError, RayError

        try:
            return ray.get([actor.info.remote() for actor in actors], timeout=timeout_s)
        except GetTimeoutError:
            raise ReplicaStartupError(f"the engine replicas did not all start {spec.model} within {timeout_s:g} s "
                                      "(is there room on the cluster for every one?)") from None
        except RayError as exc:
            raise ReplicaStartupError(f"an engine replica could not start {spec.model}: {exc}") from None

    def _stop(self, actors: list) -> None:
        import ray

        for actor in actors:
            ray.kill(actor, no_restart=True)
        if self._started_ray:
            ray.shutdown()


def start_replicas(model: str, options: ReplicaOptions, *, device: str = "auto", dtype: str | None = None,
                   config: EngineConfig | None = None, max_waiting: int = 1024, cpu_threads: int | None = None,
                   quantization: str | None = None, streaming=None) -> RayReplicaSet:
    """The engine client of ``oasr serve --ray-replicas``: the model loaded on every replica (quantized at load
    when ``quantization`` names a method)."""
    spec = EngineCoreSpec(model, device, dtype, config, logging.getLogger().getEffectiveLevel(), cpu_threads,
                          streaming=streaming, quantization=quantization)
    return RayReplicaSet(spec, options, max_waiting=max_waiting)
