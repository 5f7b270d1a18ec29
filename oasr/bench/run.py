"""``oasr bench``: throughput, latency and accuracy of the engine, optionally beside transformers on the same
weights and audio in the same process.

Audio is decoded to 16 kHz before any clock starts, for both sides; feature extraction is timed on both.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from oasr.audio import load_audio
from oasr.engine.config import CacheConfig, EngineConfig
from oasr.engine.engine import ASREngine
from oasr.models.loader import LoadedModel
from oasr.types import DecodeOptions

PEER_BATCH_SIZES = (16, 64, 256)


@dataclass(frozen=True)
class BenchItem:
    item_id: str
    audio: np.ndarray
    text: str | None
    language: str | None


@dataclass
class BenchResult:
    system: str
    num_utterances: int
    audio_seconds: float
    wall_seconds: float
    rtfx: float
    utterances_per_second: float
    wer: float | None = None
    latency_p50: float | None = None
    latency_p90: float | None = None
    latency_p99: float | None = None
    peak_gpu_memory_gib: float | None = None
    batch_size: int | None = None
    phases: dict[str, float] = field(default_factory=dict)


def load_manifest(path: Path, *, repeat: int = 1, max_seconds: float = 30.0) -> list[BenchItem]:
    """Manifest lines: {"audio": path relative to the manifest, "text"?, "language"?, "channel"?, "id"?}.
    Entries longer than one window are skipped (long-form is benchmarked separately)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def decode(row: dict) -> BenchItem:
        audio = load_audio(path.parent / row["audio"], channel=row.get("channel"))
        return BenchItem(row.get("id", row["audio"]), audio, row.get("text"), row.get("language"))

    with ThreadPoolExecutor(8) as pool:
        items = [i for i in pool.map(decode, rows) if len(i.audio) <= max_seconds * 16000]
    return [replace(i, item_id=f"{i.item_id}#{r}") for r in range(repeat) for i in items]


def _percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def _peak_memory(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bench_oasr(
    loaded: LoadedModel, items: list[BenchItem], config: EngineConfig, *, fixed_output_tokens: int | None = None,
    profile: int = 0, timed_runs: int = 1,
) -> tuple[BenchResult, dict[str, list[int]]]:
    """One warm-up pass, then ``timed_runs`` timed ones, of which the fastest counts; with ``profile``, one more
    pass under the profiler, whose top ``profile`` kernels and ops go to stderr (stdout keeps the results
    alone)."""
    engine = ASREngine(loaded, config)

    def options(item: BenchItem) -> DecodeOptions:
        # A multilingual Whisper is told each clip's language (as transformers' side is); any other model gets
        # what a server request without a language gets.
        language = item.language if getattr(loaded.config, "is_multilingual", False) else None
        if fixed_output_tokens:
            return DecodeOptions(language=language or "en", min_new_tokens=fixed_output_tokens,
                                 max_new_tokens=fixed_output_tokens)
        return DecodeOptions(language=language)

    warmup = items[: 2 * config.scheduler.max_num_seqs]
    list(engine.run((f"warmup-{i}", it.audio, options(it)) for i, it in enumerate(warmup)))
    if loaded.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(loaded.device)
    best = None
    for _ in range(timed_runs):
        engine.runner.phase_seconds = {k: 0.0 for k in engine.runner.phase_seconds}
        _sync(loaded.device)
        start = time.perf_counter()
        outputs = list(engine.run((it.item_id, it.audio, options(it)) for it in items))
        wall = time.perf_counter() - start
        if best is None or wall < best[0]:
            best = (wall, outputs, dict(engine.runner.phase_seconds))
    wall, outputs, phases = best
    latencies = [o.timings.finished - o.timings.queued for o in outputs]
    audio_s = sum(len(it.audio) for it in items) / 16000
    result = BenchResult(
        system="oasr",
        num_utterances=len(items),
        audio_seconds=audio_s,
        wall_seconds=wall,
        rtfx=audio_s / wall,
        utterances_per_second=len(items) / wall,
        latency_p50=_percentile(latencies, 50),
        latency_p90=_percentile(latencies, 90),
        latency_p99=_percentile(latencies, 99),
        peak_gpu_memory_gib=_peak_memory(loaded.device),
        batch_size=engine.runner.num_slots,
        phases=phases,
    )
    if profile:
        from oasr.bench.profiling import profile_oasr

        def again() -> tuple[float]:
            _sync(loaded.device)
            begin = time.perf_counter()
            list(engine.run((f"profiled-{it.item_id}", it.audio, options(it)) for it in items))
            _sync(loaded.device)
            return (time.perf_counter() - begin,)

        with contextlib.redirect_stdout(sys.stderr):
            profile_oasr(again, profile)
    return result, {o.request_id: o.token_ids for o in outputs}


def bench_transformers(
    loaded: LoadedModel, state_dict: dict, items: list[BenchItem], *, fixed_output_tokens: int | None = None,
    batch_sizes: Sequence[int] = PEER_BATCH_SIZES, timed_runs: int = 1,
) -> tuple[BenchResult, dict[str, list[int]]]:
    """transformers at its best batch size among ``batch_sizes`` (each run ``timed_runs`` times after a warm-up;
    the fastest run counts)."""
    from oasr.bench.peer_transformers import hf_whisper_from, run_transformers

    device, dtype = loaded.device, loaded.dtype
    model = hf_whisper_from(loaded, state_dict).to(device=device, dtype=dtype)
    language = items[0].language if loaded.config.is_multilingual else None
    audio = [it.audio for it in items]
    best = None
    for batch_size in batch_sizes:
        run_transformers(model, loaded, audio[:batch_size], batch_size=batch_size, device=device, dtype=dtype,
                         language=language, fixed_output_tokens=fixed_output_tokens)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        for _ in range(timed_runs):
            run = run_transformers(model, loaded, audio, batch_size=batch_size, device=device, dtype=dtype,
                                   language=language, fixed_output_tokens=fixed_output_tokens)
            if best is None or run.seconds < best[0].seconds:
                best = (run, _peak_memory(device))
    run, peak = best
    audio_s = sum(len(a) for a in audio) / 16000
    result = BenchResult(
        system="transformers",
        num_utterances=len(items),
        audio_seconds=audio_s,
        wall_seconds=run.seconds,
        rtfx=audio_s / run.seconds,
        utterances_per_second=len(items) / run.seconds,
        peak_gpu_memory_gib=peak,
        batch_size=run.batch_size,
    )
    return result, {it.item_id: ids for it, ids in zip(items, run.token_ids, strict=True)}


def single_request_latency(loaded: LoadedModel, state_dict: dict | None, items: list[BenchItem], config: EngineConfig,
                           *, count: int = 20) -> dict[str, float]:
    """Mean seconds to transcribe one request alone (OASR engine vs transformers at batch 1)."""
    engine = ASREngine(loaded, config)
    sample = items[:count]
    list(engine.run((f"w{i}", it.audio, DecodeOptions(language=it.language if loaded.config.is_multilingual else None))
                    for i, it in enumerate(sample[:2])))
    times = {"oasr": [], "transformers": []}
    for i, it in enumerate(sample):
        start = time.perf_counter()
        list(engine.run([(f"s{i}", it.audio, DecodeOptions(
            language=it.language if loaded.config.is_multilingual else None))]))
        times["oasr"].append(time.perf_counter() - start)
    if state_dict is not None:
        from oasr.bench.peer_transformers import hf_whisper_from, run_transformers

        model = hf_whisper_from(loaded, state_dict).to(device=loaded.device, dtype=loaded.dtype)
        language = sample[0].language if loaded.config.is_multilingual else None
        run_transformers(model, loaded, [sample[0].audio], batch_size=1, device=loaded.device, dtype=loaded.dtype,
                         language=language)
        for it in sample:
            run = run_transformers(model, loaded, [it.audio], batch_size=1, device=loaded.device, dtype=loaded.dtype,
                                   language=language)
            times["transformers"].append(run.seconds)
    return {k: float(np.mean(v)) for k, v in times.items() if v}


def engine_config(
    args_memory_gib: float, max_num_seqs: int, cuda_graphs: bool, compile_encoder: bool = False,
    kv_cache_dtype: str = "auto",
) -> EngineConfig:
    base = EngineConfig(cache=CacheConfig(memory_budget_bytes=int(args_memory_gib * 2**30),
                                          kv_cache_dtype=kv_cache_dtype))
    return replace(base, scheduler=replace(base.scheduler, max_num_seqs=max_num_seqs),
                   runner=replace(base.runner, cuda_graphs=cuda_graphs, compile_encoder=compile_encoder))


def as_json(results: list[BenchResult], extra: dict) -> str:
    return json.dumps({"results": [asdict(r) for r in results], **extra}, indent=2)
