"""``oasr serve --ray-replicas N``: N engines, each in a Ray actor of its own, behind the one HTTP server.

Every replica (``EngineReplica``) loads the model and runs the engine's step loop on a thread of its actor
(``AsyncEngine``, the engine of ``--engine-mode thread``); its methods answer the calls of the engine-client
interface, and a request's outputs come back as a Ray streaming generator. The server's process holds a
``RayReplicaSet``: an ``EngineClient`` that sends each request to the replica with the fewest requests in
flight, so the HTTP side (admission, uploads, SSE, realtime sessions, API keys, /metrics) is the one a single
engine has.

- A client that leaves, or a request that times out, cancels its Ray call; the replica aborts the request.
- A replica that dies fails its requests in flight with ``ReplicaLostError`` (503, retry); the others go on.
  Ray restarts its process (``MAX_REPLICA_RESTARTS``), the model loads again, and it is sent requests once it
  answers. An engine whose step loop failed ends its own process, so that it is restarted the same way.
- A thread polls every replica's stats (``STATS_POLL_S``): they are what /metrics shows, summed and per
  replica, and a replica that answers is up again.

Ray is an optional dependency (``pip install 'oasr[ray]'``): this module imports it only when a set starts.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from oasr.engine.config import EngineConfig
from oasr.engine.core_protocol import EngineCoreSpec, EngineInfo
from oasr.engine.relay import EngineDeadError, EngineOverloadedError, ReplicaLostError
from oasr.engine.request import RequestOutput
from oasr.engine.stats import EngineStats, ReplicaStats
from oasr.errors import OASRError, UnsupportedOptionError
from oasr.models.base import AlignmentRow
from oasr.models.capabilities import ModelCapabilities
from oasr.types import DecodeOptions, Word

log = logging.getLogger(__name__)
RAY_MISSING = "--ray-replicas needs Ray, which is not installed: pip install 'oasr[ray]'"
# Restarts of one replica before it stays down: a server outlives many single crashes, but a model that kills
# its process each time it loads should not be loaded forever.
MAX_REPLICA_RESTARTS = 16
STATS_POLL_S = 0.5  # how often each replica is asked for its stats (what /metrics and the routing see)
STARTUP_TIMEOUT_S = 1800.0  # for every replica to load its model (a large checkpoint on a cold disk is slow)
STOP_WAIT_S = 10.0
_CHECK_CACHE_SIZE = 256  # distinct option sets remembered (clients choose the language string)


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
    """A Ray actor holding one engine. Its methods are the engine-client interface, over Ray calls."""

    def __init__(self, spec: EngineCoreSpec, max_waiting: int) -> None:
        from oasr.heap import bound_heap

        bound_heap()
        logging.basicConfig(level=spec.log_level, format="%(levelname)s %(name)s [replica]: %(message)s")
        import torch

        from oasr.engine.async_engine import AsyncEngine
        from oasr.models.loader import from_pretrained

        if spec.cpu_threads is not None:  # else Ray's: one thread per CPU the actor reserves
            torch.set_num_threads(spec.cpu_threads)
        loaded = from_pretrained(spec.model, device=spec.device, dtype=spec.dtype, quantization=spec.quantization)
        self.engine = AsyncEngine(loaded, spec.config, max_waiting=max_waiting, live_streams=False)

    def info(self) -> EngineInfo:
        loaded = self.engine.loaded
        return EngineInfo(loaded.name, str(loaded.device), self.engine.window_samples, loaded.tokenizer,
                          self.engine.stats(), self.engine.supports_word_timestamps, self.engine.capabilities)

    def stats(self) -> EngineStats:
        if not self.engine.alive:
            # Its step loop failed (logged there): nothing more can be served from this process. Ending it makes
            # Ray start the replica again, with a fresh engine.
            log.error("the replica's engine has stopped; ending its process so that Ray restarts it")
            os._exit(1)
        return self.engine.stats()

    async def check(self, options: DecodeOptions) -> str | None:
        try:
            await self.engine.check(options)
        except UnsupportedOptionError as exc:
            return str(exc)
        return None

    async def generate(self, audio: np.ndarray, options: DecodeOptions,
                       partial: bool) -> AsyncIterator[RequestOutput]:
        # Ray hands over a read-only view of its object store; a copy of our own lets that go at once.
        audio = np.array(audio, dtype=np.float32)
        # A cancelled call (the server's client left) raises CancelledError here, which aborts the request.
        async for output in self.engine.generate(audio, options, partial=partial):
            yield output

    async def align_words(self, rows: Sequence[AlignmentRow], audio: Sequence[np.ndarray]) -> list[list[Word]]:
        return await self.engine.align_words(rows, [np.array(a, dtype=np.float32) for a in audio])


@dataclass
class _Replica:
    """The server's view of one replica; changed on the server's event loop and the stats thread, under the
    set's lock."""

    replica_id: int
    actor: Any  # its Ray actor handle
    engine: EngineStats
    up: bool = True
    num_requests: int = 0
    num_in_flight: int = 0
    pending_stats: Any = None  # the stats call on its way (an ObjectRef), if any

    def snapshot(self) -> ReplicaStats:
        return ReplicaStats(self.replica_id, self.up, self.num_requests, self.num_in_flight, self.engine)


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
        actors = [actor_class.remote(spec, max_waiting) for _ in range(options.num_replicas)]
        try:
            infos = self._wait_ready(spec, actors, startup_timeout_s)
        except BaseException:
            self._stop(actors)
            raise
        self.info = infos[0]
        self.tokenizer = self.info.tokenizer
        self._replicas = [_Replica(i, actor, info.stats) for i, (actor, info) in enumerate(zip(actors, infos))]
        self._lock = threading.Lock()
        self._check_cache: OrderedDict[DecodeOptions, str | None] = OrderedDict()
        self._closing = threading.Event()
        self._poller = threading.Thread(target=self._poll_loop, name="oasr-replica-stats", daemon=True)
        self._poller.start()

    # ------------------------------------------------------------------ the engine-client interface

    @property
    def window_samples(self) -> int:
        return self.info.window_samples

    @property
    def alive(self) -> bool:
        """While at least one replica answers (none up, all restarting or dead, reads as unhealthy)."""
        with self._lock:
            return any(r.up for r in self._replicas)

    @property
    def supports_word_timestamps(self) -> bool:
        return self.info.supports_word_timestamps

    @property
    def capabilities(self) -> ModelCapabilities:
        """The model's record, less live streams: replicas serve whole requests only, so realtime sessions of a
        streaming model are transcribed turn by turn, as an offline model's are."""
        return replace(self.info.capabilities, streaming=None)

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
                           sum(s.num_slots for s in up), encode, decode, replicas=replicas)

    async def check(self, options: DecodeOptions) -> None:
        """Asks a replica (once per distinct option set) whether the model serves ``options``."""
        with self._lock:
            known = options in self._check_cache
            error = self._check_cache.get(options)
        if not known:
            replica = self._acquire(count=False)
            error = await self._answer(replica, replica.actor.check.remote(options))
            with self._lock:
                self._check_cache[options] = error
                while len(self._check_cache) > _CHECK_CACHE_SIZE:
                    self._check_cache.popitem(last=False)
        if error is not None:
            raise UnsupportedOptionError(error)

    async def align_words(self, rows: Sequence[AlignmentRow], audio: Sequence[np.ndarray]) -> Sequence[Sequence[Word]]:
        replica = self._acquire(count=False)
        return await self._answer(replica, replica.actor.align_words.remote(list(rows), list(audio)))

    async def generate(self, audio: np.ndarray, options: DecodeOptions, *,
                       partial: bool = True) -> AsyncIterator[RequestOutput]:
        """This request's outputs from the least-loaded replica. Leaving early cancels the replica's call."""
        import ray
        from ray.exceptions import RayActorError

        replica = self._acquire(count=True)
        outputs = None
        finished = False
        try:
            outputs = replica.actor.generate.remote(np.ascontiguousarray(audio, dtype=np.float32), options, partial)
            async for ref in outputs:
                output = await self._answer(replica, ref)
                yield output
                finished = output.finished
        except RayActorError as exc:  # the stream itself broke off: its replica died between two outputs
            raise self._lost(replica, exc) from None
        finally:
            with self._lock:
                replica.num_in_flight -= 1
            if outputs is not None and not finished:
                try:
                    ray.cancel(outputs)
                except Exception:  # its replica is gone, and the call with it
                    pass

    def shutdown(self) -> None:
        """Stops the stats thread and the replicas; shuts Ray down if this set started it."""
        if self._closing.is_set():
            return
        self._closing.set()
        self._poller.join(timeout=STOP_WAIT_S)
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

    async def _answer(self, replica: _Replica, ref) -> Any:
        """What a replica's call returns; its own error as it raised it, or ``ReplicaLostError`` if it died."""
        from ray.exceptions import RayActorError, RayTaskError

        try:
            return await ref
        except RayTaskError as exc:
            if isinstance(exc.cause, EngineDeadError):  # its step loop failed: that replica is down, not the server
                raise self._lost(replica, exc.cause) from None
            if isinstance(exc.cause, OASRError):  # raised by the engine, for the caller: its own type and message
                raise exc.cause from None
            log.error("replica %d failed a call: %s", replica.replica_id, exc)
            raise ReplicaLostError(f"engine replica {replica.replica_id} failed: {exc.cause!r}") from None
        except RayActorError as exc:
            raise self._lost(replica, exc) from None

    def _lost(self, replica: _Replica, reason: object) -> ReplicaLostError:
        """Marks ``replica`` down; the error for the request it failed."""
        self._mark_down(replica, reason)
        return ReplicaLostError(f"engine replica {replica.replica_id} stopped; retry the request")

    def _mark_down(self, replica: _Replica, reason: object) -> None:
        with self._lock:
            was_up, replica.up = replica.up, False
        if was_up:
            log.error("engine replica %d is down (%s); the others serve until it is back", replica.replica_id,
                      str(reason).splitlines()[0])

    # ------------------------------------------------------------------ stats (the poll thread)

    def _poll_loop(self) -> None:
        import ray

        while not self._closing.wait(STATS_POLL_S):
            for replica in self._replicas:
                if replica.pending_stats is None:
                    replica.pending_stats = replica.actor.stats.remote()
            pending = [r.pending_stats for r in self._replicas]
            ready, _ = ray.wait(pending, num_returns=len(pending), timeout=0)
            for replica in self._replicas:
                if replica.pending_stats in ready:
                    self._take_stats(replica, replica.pending_stats)
                    replica.pending_stats = None

    def _take_stats(self, replica: _Replica, ref) -> None:
        import ray
        from ray.exceptions import RayError

        try:
            stats = ray.get(ref)
        except RayError as exc:  # dead, or restarting: the next call waits for its new process
            self._mark_down(replica, exc)
            return
        with self._lock:
            was_up, replica.up, replica.engine = replica.up, True, stats
        if not was_up:
            log.warning("engine replica %d is up again", replica.replica_id)

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
                   config: EngineConfig | None = None, max_waiting: int = 1024,
                   cpu_threads: int | None = None, quantization: str | None = None) -> RayReplicaSet:
    """The engine client of ``oasr serve --ray-replicas``: the model loaded on every replica (quantized at load
    when ``quantization`` names a method)."""
    spec = EngineCoreSpec(model, device, dtype, config, logging.getLogger().getEffectiveLevel(), cpu_threads,
                          quantization=quantization)
    return RayReplicaSet(spec, options, max_waiting=max_waiting)
