"""Running a real ``oasr serve`` app on loopback for tests, and reading its metrics."""

from __future__ import annotations

import contextlib
import io
import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, replace

import httpx
import numpy as np
import soundfile as sf
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from oasr.engine.config import CacheConfig, EngineConfig
from oasr.engine.request import BULK_PRIORITY
from oasr.engine.stats import EngineStats
from oasr.serving.app import start_engine
from oasr.serving.metrics import ServerMetrics
from oasr.hosting.engine_client import EngineClient
from oasr.types import DecodeOptions

SMALL_ENGINE = EngineConfig(cache=CacheConfig(memory_budget_bytes=256 << 20))
WAIT_S = 120  # generous: the 2 CPU cores are shared with other test runs; only a hang should hit this


def small_engine(model: str, mode: str | None = None, **kwargs) -> EngineClient:
    """``model`` on CPU in fp32 with a small KV budget; by default in an engine-core process, as served
    (``OASR_TEST_ENGINE_MODE=thread`` runs the server suites against the in-process engine thread instead)."""
    mode = mode or os.environ.get("OASR_TEST_ENGINE_MODE", "process")
    if mode == "process":  # the test machine's few cores are shared with the test process and other runs
        kwargs.setdefault("cpu_threads", 1)
    return start_engine(model, mode=mode, device="cpu", dtype="float32", config=SMALL_ENGINE, **kwargs)


@contextlib.contextmanager
def running_server(app, **config) -> Iterator[str]:
    """Serves ``app`` with uvicorn on 127.0.0.1 (a free port) in a background thread; yields its base URL.
    ``config``: more ``uvicorn.Config`` options (``ws_max_size``, say)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off", timeout_graceful_shutdown=2,
                                            **config))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="oasr-test-server", daemon=True)
    thread.start()
    wait_until(lambda: server.started, "the server to start")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def metrics(base_url: str) -> dict[str, float]:
    """Every sample on /metrics, keyed by its name and labels as Prometheus writes them."""
    return samples(httpx.get(f"{base_url}/metrics", timeout=30).text)


@dataclass
class StatsOnlyEngine:
    """An engine client that is only its numbers: what ``ServerMetrics`` reads of one."""

    engine_stats: EngineStats
    alive: bool = True

    def stats(self) -> EngineStats:
        return self.engine_stats


def metrics_of(stats: EngineStats) -> dict[str, float]:
    """The samples /metrics shows for an engine reporting ``stats``, keyed as ``metrics`` keys them."""
    body, _ = ServerMetrics(StatsOnlyEngine(stats), lambda: 0).exposition()
    return samples(body.decode())


def samples(text: str) -> dict[str, float]:
    """Every sample of a Prometheus text exposition, keyed by its name and labels as Prometheus writes them."""
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            values[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return values


def engine_idle(base_url: str) -> bool:
    m = metrics(base_url)
    return (m["oasr_engine_requests_running"] == 0 and m["oasr_engine_requests_waiting"] == 0
            and m["oasr_engine_kv_blocks_used"] == 0 and m["oasr_http_requests_in_flight"] == 0)


def wav_bytes(samples: np.ndarray, sample_rate: int = 16_000) -> bytes:
    out = io.BytesIO()
    sf.write(out, samples.astype(np.float32), sample_rate, format="WAV", subtype="PCM_16")
    return out.getvalue()


class _WrappedEngine:
    """Passes everything but ``generate`` through to the real engine."""

    def __init__(self, engine: EngineClient) -> None:
        self._engine = engine
        self.tokenizer = engine.tokenizer

    @property
    def window_samples(self) -> int:
        return self._engine.window_samples

    @property
    def alive(self) -> bool:
        return self._engine.alive

    @property
    def state(self) -> str:
        return self._engine.state

    @property
    def num_restarts(self) -> int:
        return self._engine.num_restarts

    @property
    def supports_word_timestamps(self) -> bool:
        return self._engine.supports_word_timestamps

    @property
    def capabilities(self):
        return self._engine.capabilities

    async def check(self, options) -> None:
        await self._engine.check(options)

    async def align_words(self, rows, audio):
        return await self._engine.align_words(rows, audio)

    @property
    def diarization_model(self):
        return self._engine.diarization_model

    async def diarize(self, audio, threshold: float = 0.5):
        return await self._engine.diarize(audio, threshold)

    def stats(self):
        return self._engine.stats()


class RecordingEngine(_WrappedEngine):
    """The real engine, keeping the options and the priority of every window it is asked to decode, in order."""

    def __init__(self, engine: EngineClient) -> None:
        super().__init__(engine)
        self.options: list[DecodeOptions] = []
        self.priorities: list[int] = []

    def generate(self, audio, options, *, partial: bool = True, priority: int = BULK_PRIORITY) -> AsyncIterator:
        self.options.append(options)
        self.priorities.append(priority)
        return self._engine.generate(audio, options, partial=partial, priority=priority)


class SlowEngine(_WrappedEngine):
    """The real engine, made to decode ``min_new_tokens`` tokens per window (end-of-text is suppressed until
    then), so a request is surely still running when a test acts on it. Counts how each window's output
    iterator ended: finished, or closed early (which is what aborts the engine request)."""

    def __init__(self, engine: EngineClient, min_new_tokens: int = 400) -> None:
        super().__init__(engine)
        self.min_new_tokens = min_new_tokens
        self.num_finished = 0
        self.num_closed_early = 0

    async def generate(self, audio, options, *, partial: bool = True, priority: int = BULK_PRIORITY) -> AsyncIterator:
        finished = False
        try:
            slow = replace(options, min_new_tokens=self.min_new_tokens)
            outputs = self._engine.generate(audio, slow, partial=partial, priority=priority)
            async with contextlib.aclosing(outputs) as outputs:
                async for output in outputs:
                    finished = output.finished
                    yield output
        finally:
            if finished:
                self.num_finished += 1
            else:
                self.num_closed_early += 1


class BrokenEngine(_WrappedEngine):
    """The real engine, failing with ``error`` after ``after`` outputs of each window, or at its last output
    if that comes first (a server-side fault)."""

    def __init__(self, engine: EngineClient, error: Exception, after: int) -> None:
        super().__init__(engine)
        self.error = error
        self.after = after

    async def generate(self, audio, options, *, partial: bool = True, priority: int = BULK_PRIORITY) -> AsyncIterator:
        outputs = self._engine.generate(audio, options, partial=partial, priority=priority)
        async with contextlib.aclosing(outputs) as outputs:
            num_outputs = 0
            async for output in outputs:
                if num_outputs == self.after or output.finished:
                    raise self.error
                num_outputs += 1
                yield output
