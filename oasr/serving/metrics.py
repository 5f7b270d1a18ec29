"""Prometheus metrics, on a registry of the app's own (two apps in one process never share counters).

HTTP requests are counted by route and status in a small ASGI middleware; latencies and audio seconds are
observed by the serving logic; engine numbers (queue, running rows, KV blocks, the batch sizes of its steps)
are read from ``EngineClient.stats()`` when Prometheus scrapes, so nothing has to keep them in step.

With several API worker processes (``oasr serve --api-workers N``) the main process sets
``PROMETHEUS_MULTIPROC_DIR``: every worker's HTTP counters, histograms and in-flight gauge go to files there
and any worker's /metrics sums them over all workers (prometheus_client's multiprocess mode); the engine
numbers come from the one shared engine core, so any worker reports them whole.

With engine replicas (``oasr serve --ray-replicas N``) the engine numbers are the replicas' sums, and the
``oasr_replica_*`` series, labelled ``replica``, give each one's own.

With a two-pass final (``oasr serve --final-model``) the ``oasr_final_model_*`` series show the finals it holds
and, of those it has sent, how many carry its transcript and how many the online text (it could not take the
audio), beside its own engine's queue.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from oasr.engine.batch_stats import BatchSizeCounts
from oasr.engine.stats import FinalPassStats, ReplicaStats
from oasr.hosting.engine_client import EngineClient

# Seconds: from well under a GPU step to a long file on a busy CPU.
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 60.0, 120.0, 300.0, 600.0)
_UNMATCHED_ROUTE = "unmatched"  # unknown paths share one label, so scanners cannot grow the label set
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
_IN_FLIGHT = ("oasr_http_requests_in_flight", "Transcription requests admitted and not yet answered")


class ServerMetrics:
    def __init__(self, engine: EngineClient, num_in_flight: Callable[[], int]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("oasr_http_requests", "HTTP requests answered, by route and status",
                                ["route", "status"], registry=self.registry)
        self.queue_seconds = Histogram("oasr_request_queue_seconds",
                                       "Engine queue time of one window: added to encode start",
                                       buckets=LATENCY_BUCKETS, registry=self.registry)
        self.first_token_seconds = Histogram("oasr_request_first_token_seconds",
                                             "Admission of a transcription request to its first token",
                                             buckets=LATENCY_BUCKETS, registry=self.registry)
        self.total_seconds = Histogram("oasr_request_total_seconds",
                                       "Admission of a transcription request to its last token",
                                       buckets=LATENCY_BUCKETS, registry=self.registry)
        self.audio_seconds = Counter("oasr_audio_seconds", "Seconds of audio transcribed",
                                     registry=self.registry)
        self._multiprocess = bool(os.environ.get(MULTIPROC_ENV))
        # /v1/realtime: sessions open, audio received, and a turn's latency from its commit to its transcript.
        self.realtime_sessions = Gauge("oasr_realtime_sessions", "Realtime transcription sessions open",
                                       multiprocess_mode="livesum", registry=self.registry)
        self.realtime_audio_seconds = Counter("oasr_realtime_audio_seconds",
                                              "Seconds of audio received by realtime sessions",
                                              registry=self.registry)
        self.realtime_completion_seconds = Histogram("oasr_realtime_completion_seconds",
                                                     "A realtime turn's commit to its completed transcript",
                                                     buckets=LATENCY_BUCKETS, registry=self.registry)
        # A streaming model's deltas: from the append whose audio decided the text to the delta sent.
        self.realtime_delta_seconds = Histogram("oasr_realtime_delta_seconds",
                                                "A streamed realtime delta's audio arriving to the delta sent",
                                                buckets=LATENCY_BUCKETS, registry=self.registry)
        # One of several workers: its in-flight count is a gauge the workers' files sum; alone, it is read live.
        self._in_flight = Gauge(*_IN_FLIGHT, multiprocess_mode="livesum", registry=self.registry) \
            if self._multiprocess else None
        self._engine_collector = _EngineCollector(engine, None if self._multiprocess else num_in_flight)
        if not self._multiprocess:
            self.registry.register(self._engine_collector)

    def in_flight_changed(self, num_in_flight: int) -> None:
        if self._in_flight is not None:
            self._in_flight.set(num_in_flight)

    def exposition(self) -> tuple[bytes, str]:
        if not self._multiprocess:
            return generate_latest(self.registry), CONTENT_TYPE_LATEST
        registry = CollectorRegistry()  # every worker's counters and histograms, summed; the core's numbers
        MultiProcessCollector(registry)
        registry.register(self._engine_collector)
        return generate_latest(registry), CONTENT_TYPE_LATEST


class _EngineCollector(Collector):
    def __init__(self, engine: EngineClient, num_in_flight: Callable[[], int] | None) -> None:
        self._engine = engine
        self._num_in_flight = num_in_flight

    def collect(self) -> Iterator[Metric]:
        stats = self._engine.stats()
        if self._num_in_flight is not None:
            yield GaugeMetricFamily(*_IN_FLIGHT, value=self._num_in_flight())
        values = (
            ("oasr_engine_requests_running", "Engine requests (30 s windows) holding decode rows; the decode "
             "batch size", stats.num_running),
            ("oasr_engine_requests_waiting", "Engine requests (30 s windows) queued for encoding",
             stats.num_waiting),
            ("oasr_engine_kv_blocks_used", "Self-attention KV blocks in use", stats.kv_blocks_used),
            ("oasr_engine_kv_blocks_total", "Self-attention KV blocks in the pool", stats.kv_blocks_total),
            ("oasr_engine_slots", "Decode rows (cross-attention slots) the memory plan allows", stats.num_slots),
            ("oasr_engine_streams_active", "Live streams open (a streaming model's realtime turns)",
             stats.num_streams),
            ("oasr_engine_stream_slots", "Live streams the engine can hold at once (0: the model does not "
             "stream)", stats.stream_slots),
        )
        for name, documentation, value in values:
            yield GaugeMetricFamily(name, documentation, value=value)
        yield GaugeMetricFamily("oasr_engine_up", "1 while the engine runs, 0 while a new engine core starts or "
                                "once it has stopped", value=int(self._engine.alive))
        yield CounterMetricFamily("oasr_engine_restarts", "Engine cores started again after the one before died",
                                  value=getattr(self._engine, "num_restarts", 0))
        yield _histogram("oasr_engine_encode_batch_size", "Requests encoded together, per engine step that encodes",
                         stats.encode_batch_sizes)
        yield _histogram("oasr_engine_decode_batch_size", "Requests decoded together, per engine step that decodes",
                         stats.decode_batch_sizes)
        if stats.final_pass is not None:
            yield from _final_pass_metrics(stats.final_pass)
        if stats.replicas:
            yield from _replica_metrics(stats.replicas)


def _final_pass_metrics(final_pass: FinalPassStats) -> Iterator[Metric]:
    """``--final-model``: the two-pass final's held utterances, how their finals ended, and the final model's
    own engine queue. Absent without a final model, as the replica series are without replicas: a server that
    has none has nothing these could count, and a zero would read as a final model that is idle."""
    families = (
        (GaugeMetricFamily, "oasr_final_model_finals_waiting", "Streamed utterances whose final is held for the "
         "final model's transcript", final_pass.num_waiting),
        (CounterMetricFamily, "oasr_final_model_finals_completed", "Utterance finals sent with the final model's "
         "transcript", final_pass.num_completed),
        (CounterMetricFamily, "oasr_final_model_fallbacks", "Utterance finals sent with the streaming model's own "
         "text because the final model could not take the utterance's audio", final_pass.num_fallbacks),
        (GaugeMetricFamily, "oasr_final_model_requests_waiting", "The final model's engine requests (windows of "
         "held utterances) queued for encoding", final_pass.num_requests_waiting),
        (GaugeMetricFamily, "oasr_final_model_requests_running", "The final model's engine requests holding "
         "decode rows", final_pass.num_requests_running),
    )
    for family_type, name, documentation, value in families:
        yield family_type(name, documentation, value=value)


def _replica_metrics(replicas: tuple[ReplicaStats, ...]) -> Iterator[Metric]:
    """``--ray-replicas``: how many are up, and each one's numbers by its ``replica`` label (the unlabelled
    engine metrics above are their sums)."""
    yield GaugeMetricFamily("oasr_engine_replicas_up", "Engine replicas up (answering) now",
                            value=sum(r.up for r in replicas))
    yield GaugeMetricFamily("oasr_engine_replicas", "Engine replicas configured", value=len(replicas))
    families = (
        (GaugeMetricFamily, "oasr_replica_up", "1 while the replica answers, 0 while it is dead or restarting",
         lambda r: int(r.up)),
        (CounterMetricFamily, "oasr_replica_requests", "Engine requests (30 s windows) routed to the replica",
         lambda r: r.num_requests),
        (GaugeMetricFamily, "oasr_replica_requests_in_flight", "Engine requests routed to the replica and not "
         "yet finished", lambda r: r.num_in_flight),
        (GaugeMetricFamily, "oasr_replica_requests_running", "The replica's engine requests holding decode rows",
         lambda r: r.engine.num_running),
        (GaugeMetricFamily, "oasr_replica_requests_waiting", "The replica's engine requests queued for encoding",
         lambda r: r.engine.num_waiting),
        (CounterMetricFamily, "oasr_replica_encoded_windows", "Windows the replica's engine encoded, by its own "
         "count (starts again when the replica restarts)", lambda r: r.engine.encode_batch_sizes.num_rows),
    )
    for family_type, name, documentation, value in families:
        family = family_type(name, documentation, labels=["replica"])
        for replica in replicas:
            family.add_metric([str(replica.replica_id)], value(replica))
        yield family


def _histogram(name: str, documentation: str, counts: BatchSizeCounts) -> HistogramMetricFamily:
    buckets = [(floatToGoString(bound), count) for bound, count in zip(counts.bounds, counts.cumulative, strict=True)]
    return HistogramMetricFamily(name, documentation, buckets=[*buckets, ("+Inf", counts.num_steps)],
                                 sum_value=counts.num_rows)


class MetricsMiddleware:
    """Counts every HTTP response by route template and status (500 when the app raised)."""

    def __init__(self, app: ASGIApp, metrics: ServerMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def send_recording(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_recording)
        finally:
            route = scope.get("route")
            label = getattr(route, "path", _UNMATCHED_ROUTE)
            self.metrics.requests.labels(route=label, status=str(status)).inc()
