"""Load test for ``oasr serve`` against the offline engine on the same audio, so the cost of the HTTP path shows
as a ratio. One command runs it all: for each engine mode, a real server process is started and loaded at each
concurrency level (closed loop: every client sends its next request when the last one is answered); then the
engine runs in-process on the same clips, 64 requests at a time (and all at once), with no HTTP in between.

    python -m oasr.bench.serve_load --model tiny.en --manifest shared/data/speech/manifest.jsonl \\
        --concurrency 1 8 32 64 --engine-mode process thread --api-workers 1 8

Clients run in several processes (``--client-processes``) so that the load generator is not what limits the
server. Each level sends ``--requests-per-client`` requests per client (at least 64, at most ``--requests``);
RTFx is the audio seconds answered over the level's wall time. Issue 4's target: the server at 64 concurrent
clients within 15% of the offline engine's throughput at 64 concurrent (ratio >= 0.85).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path

import numpy as np

from oasr.bench.server_process import running_server, serve_command

TARGET_RATIO = 0.85  # issue 4: within 15% of the offline engine at 64 concurrent


@dataclass(frozen=True)
class Clip:
    path: str  # absolute
    duration_s: float


@dataclass(frozen=True)
class ClientShare:
    """One client process's part of a level: its connections and the clip indices it sends, in order."""

    url: str
    model: str
    clips: tuple[Clip, ...]
    order: tuple[int, ...]
    num_connections: int
    start_at: float  # time.time() at which every client process starts sending


@dataclass(frozen=True)
class ShareResult:
    latencies: tuple[float, ...]
    audio_s: float
    num_failures: int
    first_failure: str | None
    started: float
    ended: float


def percentiles(values) -> dict[str, float | None]:
    if len(values) == 0:
        return {"p50": None, "p90": None, "p99": None}
    return {f"p{q}": round(float(np.percentile(values, q)), 4) for q in (50, 90, 99)}


def _run_share(share: ClientShare) -> ShareResult:
    """A client process: ``num_connections`` closed-loop clients on one event loop."""
    return asyncio.run(_load_share(share))


async def _load_share(share: ClientShare) -> ShareResult:
    import httpx

    payloads = [(Path(c.path).name, Path(c.path).read_bytes(), c.duration_s) for c in share.clips]
    todo = list(reversed(share.order))
    latencies: list[float] = []
    audio_s, failures, first_failure = 0.0, 0, None

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal audio_s, failures, first_failure
        while todo:
            name, data, seconds = payloads[todo.pop()]
            start = time.perf_counter()
            try:
                response = await http.post(f"{share.url}/v1/audio/transcriptions", files={"file": (name, data)},
                                           data={"model": share.model, "response_format": "json"})
                status, body = response.status_code, response.text
            except httpx.HTTPError as exc:
                status, body = None, repr(exc)
            if status == 200:
                latencies.append(time.perf_counter() - start)
                audio_s += seconds
            else:
                failures += 1
                first_failure = first_failure or f"{status}: {body[:300]}"

    limits = httpx.Limits(max_connections=share.num_connections, max_keepalive_connections=share.num_connections)
    async with httpx.AsyncClient(timeout=600, limits=limits) as http:
        await asyncio.sleep(max(share.start_at - time.time(), 0.0))
        started = time.time()
        await asyncio.gather(*(client(http) for _ in range(share.num_connections)))
        ended = time.time()
    return ShareResult(tuple(latencies), audio_s, failures, first_failure, started, ended)


def run_level(pool: ProcessPoolExecutor, num_processes: int, url: str, model: str, clips: list[Clip], *,
              concurrency: int, num_requests: int) -> dict:
    processes = min(num_processes, concurrency)
    connections = [concurrency // processes + (k < concurrency % processes) for k in range(processes)]
    order = [i % len(clips) for i in range(num_requests)]
    # Requests dealt out in proportion to connections, so every process keeps its clients busy to the end.
    shares, start = [], 0
    start_at = time.time() + 1.0
    for k, num in enumerate(connections):
        count = round(num_requests * sum(connections[: k + 1]) / concurrency) - start
        shares.append(ClientShare(url, model, tuple(clips), tuple(order[start : start + count]), num, start_at))
        start += count
    results = list(pool.map(_run_share, shares))
    wall = max(r.ended for r in results) - min(r.started for r in results)
    latencies = [x for r in results for x in r.latencies]
    audio_s = sum(r.audio_s for r in results)
    failures = sum(r.num_failures for r in results)
    row = {"concurrency": concurrency, "requests": num_requests, "failures": failures, "wall_s": round(wall, 3),
           "rtfx": round(audio_s / wall, 1), "requests_per_s": round(len(latencies) / wall, 1),
           "latency_s": percentiles(latencies)}
    first_failure = next((r.first_failure for r in results if r.first_failure), None)
    if first_failure:
        row["first_failure"] = first_failure
    return row


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _server_cpu(pid: int) -> dict[str, float] | None:
    """CPU seconds of the server (API) process and of its children together (the engine core, in process
    mode): the bench reports them per level as cores kept busy, to show which side is saturated."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        return {"api_process": _cpu_seconds(pid), "children": sum(_cpu_seconds(int(c)) for c in children)}
    except (OSError, ValueError, IndexError):
        return None


def server_label(mode: str, api_workers: int) -> str:
    return mode if api_workers == 1 else f"{mode}/{api_workers}w"


def bench_server(args: argparse.Namespace, mode: str, clips: list[Clip], pool: ProcessPoolExecutor,
                 api_workers: int = 1) -> list[dict]:
    url = f"http://127.0.0.1:{args.port}"
    label = server_label(mode, api_workers)
    log_path = Path(tempfile.gettempdir()) / f"oasr-serve-load-{label.replace('/', '-')}.log"
    command = serve_command("--model", args.model, "--port", str(args.port), "--device", args.device,
                            "--max-queue", "4096", "--engine-mode", mode, "--api-workers", str(api_workers))
    print(f"# server ({mode} engine): {' '.join(command[1:])}; log {log_path}", flush=True)
    from oasr.serving.app import served_name

    model = served_name(args.model)  # what the server calls a model given as a path (its directory's name)
    rows = []
    with running_server(command, url, log_path) as server:
        if args.warmup_requests:
            run_level(pool, args.client_processes, url, model, clips, concurrency=64,
                      num_requests=args.warmup_requests)
        for concurrency in args.concurrency:
            num_requests = min(args.requests, max(64, args.requests_per_client * concurrency))
            before = _server_cpu(server.pid)
            row = run_level(pool, args.client_processes, url, model, clips, concurrency=concurrency,
                            num_requests=num_requests)
            after = _server_cpu(server.pid)
            if before and after:
                row["cores_busy"] = {k: round((after[k] - before[k]) / row["wall_s"], 2) for k in before}
            rows.append({"engine_mode": label, "api_workers": api_workers, **row})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def bench_offline(args: argparse.Namespace, clips: list[Clip], num_requests: int) -> dict[str, dict]:
    """The engine in-process on the same clips (decoded before the clock starts)."""
    from oasr.audio import load_audio
    from oasr.bench.run import BenchItem, bench_oasr, engine_config
    from oasr.models.loader import from_pretrained

    loaded = from_pretrained(args.model, device=args.device)
    audio = [load_audio(c.path) for c in clips]
    items = [BenchItem(f"{i}", audio[i % len(clips)], None, None) for i in range(num_requests)]
    out = {}
    for label, slots in (("64_concurrent", 64), ("all_at_once", 256)):
        result, _ = bench_oasr(loaded, items, engine_config(args.memory_gib, slots, True))
        out[label] = {"rtfx": round(result.rtfx, 1), "wall_s": round(result.wall_seconds, 3),
                      "requests_per_s": round(result.utterances_per_second, 1),
                      "latency_s": {"p50": round(result.latency_p50, 4), "p90": round(result.latency_p90, 4),
                                    "p99": round(result.latency_p99, 4)}}
        print(json.dumps({"offline": label, **out[label]}), flush=True)
    return out


def manifest_rows(manifest: Path) -> list[dict]:
    """A JSONL manifest's rows, each ``audio`` (relative to the manifest) made an absolute path."""
    rows = [json.loads(line) for line in manifest.read_text().splitlines() if line.strip()]
    return [{**r, "audio": str((manifest.parent / r["audio"]).resolve())} for r in rows]


def read_clips(manifest: Path) -> list[Clip]:
    return [Clip(r["audio"], r["duration_s"]) for r in manifest_rows(manifest)
            if r["duration_s"] <= 30 and "channel" not in r]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument("--manifest", type=Path, required=True)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--engine-mode", nargs="+", default=["process"], choices=("process", "thread"),
                        help="server engine modes to load, one server after the other")
    parser.add_argument("--api-workers", type=int, nargs="+", default=[1],
                        help="HTTP worker processes per server (oasr serve --api-workers), one server per count")
    parser.add_argument("--requests", type=int, default=2048, help="most requests in one level")
    parser.add_argument("--requests-per-client", type=int, default=32)
    parser.add_argument("--client-processes", type=int, default=4)
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--memory-gib", type=float, default=8.0, help="the offline engine's KV memory budget")
    parser.add_argument("--warmup-requests", type=int, default=256, help="sent at concurrency 64 before measuring")
    parser.add_argument("--skip-offline", action="store_true")
    args = parser.parse_args(argv)
    clips = read_clips(args.manifest)
    with ProcessPoolExecutor(args.client_processes, mp_context=get_context("spawn")) as pool:
        configs = [(mode, n) for mode in args.engine_mode for n in args.api_workers if mode == "process" or n == 1]
        server = [row for mode, n in configs for row in bench_server(args, mode, clips, pool, n)]
    summary: dict = {"model": args.model, "clips": len(clips), "server": server}
    if not args.skip_offline:
        offline_requests = min(args.requests, max(64, args.requests_per_client * 64))
        summary["offline"] = offline = bench_offline(args, clips, offline_requests)
        reference = offline["64_concurrent"]["rtfx"]
        summary["server_over_offline_64_concurrent"] = {
            row["engine_mode"]: round(row["rtfx"] / reference, 3) for row in server if row["concurrency"] == 64}
        summary["target_ratio"] = TARGET_RATIO
        summary["meets_target"] = {m: r >= TARGET_RATIO for m, r in summary["server_over_offline_64_concurrent"].items()}
    print(json.dumps(summary, indent=2))
    _print_table(summary)


def _print_table(summary: dict) -> None:
    print(f"\n{'system':<22}{'conc':>6}{'RTFx':>10}{'req/s':>9}{'p50 s':>9}{'p90 s':>9}{'p99 s':>9}{'fail':>6}")
    for row in summary["server"]:
        lat = row["latency_s"]
        print(f"{'server/' + row['engine_mode']:<22}{row['concurrency']:>6}{row['rtfx']:>10}{row['requests_per_s']:>9}"
              f"{lat['p50']!s:>9}{lat['p90']!s:>9}{lat['p99']!s:>9}{row['failures']:>6}")
    for label, row in summary.get("offline", {}).items():
        lat = row["latency_s"]
        print(f"{'offline/' + label:<22}{'':>6}{row['rtfx']:>10}{row['requests_per_s']:>9}"
              f"{lat['p50']!s:>9}{lat['p90']!s:>9}{lat['p99']!s:>9}")
    for mode, ratio in summary.get("server_over_offline_64_concurrent", {}).items():
        verdict = "meets" if ratio >= TARGET_RATIO else "misses"
        print(f"server/{mode} at 64 / offline at 64 = {ratio:.3f} ({verdict} the {TARGET_RATIO} target)")


if __name__ == "__main__":
    main()
