"""Load test for ``oasr serve``: concurrency levels against a real server process, then the offline engine on
the same audio, so the cost of the HTTP path shows as a ratio.

    python -m oasr.bench.serve_load --model tiny.en --manifest speech/manifest.jsonl --concurrency 1 8 32 64
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


def _percentiles(values: list[float]) -> dict[str, float]:
    return {f"p{q}": round(float(np.percentile(values, q)), 4) for q in (50, 90, 99)}


async def _load(url: str, files: list[tuple[str, bytes, float]], *, concurrency: int, requests: int, model: str):
    import httpx

    latencies: list[float] = []
    failures = 0
    audio_s = 0.0
    queue: asyncio.Queue = asyncio.Queue()
    for i in range(requests):
        queue.put_nowait(files[i % len(files)])

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal failures, audio_s
        while not queue.empty():
            name, data, seconds = queue.get_nowait()
            start = time.perf_counter()
            response = await http.post(f"{url}/v1/audio/transcriptions", files={"file": (name, data)},
                                       data={"model": model, "response_format": "json"})
            if response.status_code == 200:
                latencies.append(time.perf_counter() - start)
                audio_s += seconds
            else:
                failures += 1

    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=concurrency)) as http:
        start = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(concurrency)))
        wall = time.perf_counter() - start
    return {"concurrency": concurrency, "requests": requests, "failures": failures, "wall_s": round(wall, 3),
            "rtfx": round(audio_s / wall, 1), "latency_s": _percentiles(latencies)}


def _wait_healthy(url: str, process: subprocess.Popen, timeout_s: float = 300) -> None:
    import httpx

    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise RuntimeError("server did not become healthy")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument("--manifest", type=Path, required=True)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--requests", type=int, default=512, help="requests per concurrency level")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--device", default="auto")
    args = parser.parse_args(argv)
    rows = [json.loads(line) for line in args.manifest.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r["duration_s"] <= 30 and "channel" not in r]
    files = [(Path(r["audio"]).name, (args.manifest.parent / r["audio"]).read_bytes(), r["duration_s"]) for r in rows]
    url = f"http://127.0.0.1:{args.port}"
    server = subprocess.Popen(
        [sys.executable, "-m", "oasr.cli", "serve", "--model", args.model, "--port", str(args.port),
         "--device", args.device, "--max-queue", "1024"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ.copy(),
    )
    results = []
    try:
        _wait_healthy(url, server)
        asyncio.run(_load(url, files, concurrency=8, requests=64, model=args.model))  # warm-up
        for concurrency in args.concurrency:
            results.append(asyncio.run(_load(url, files, concurrency=concurrency, requests=args.requests,
                                             model=args.model)))
            print(json.dumps(results[-1]), flush=True)
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=60)
    offline = _offline(args, rows)
    summary = {"server": results, "offline": offline}
    top = next((r for r in results if r["concurrency"] == 64), results[-1])
    summary["server_over_offline_at_64"] = {k: round(top["rtfx"] / v["rtfx"], 3) for k, v in offline.items()}
    print(json.dumps(summary, indent=2))


def _offline(args: argparse.Namespace, rows: list[dict]) -> dict[str, dict]:
    """The engine in-process on the same clips (decoded untimed): all requests at once, and 64 at a time."""
    from oasr.audio import load_audio
    from oasr.bench.run import BenchItem, bench_oasr, engine_config
    from oasr.models.loader import from_pretrained

    loaded = from_pretrained(args.model, device=args.device)
    clips = [BenchItem(r["id"], load_audio(args.manifest.parent / r["audio"]), r.get("text"), r.get("language"))
             for r in rows]
    items = [BenchItem(f"{clips[i % len(clips)].item_id}#{i}", clips[i % len(clips)].audio, None, None)
             for i in range(args.requests)]
    out = {}
    for label, slots in (("all_at_once", 256), ("64_concurrent", 64)):
        result, _ = bench_oasr(loaded, items, engine_config(8, slots, True))
        out[label] = {"rtfx": round(result.rtfx, 1), "wall_s": round(result.wall_seconds, 3)}
    return out


if __name__ == "__main__":
    main()
