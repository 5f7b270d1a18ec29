#!/usr/bin/env python3
"""Where an engine step's time goes: torch.profiler over a few encode and decode walks on the GPU.

    PYTHONPATH=. python3 scripts/profile_engine.py --manifest speech/manifest.jsonl --model tiny.en
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from oasr.bench.run import engine_config, load_manifest
from oasr.engine.engine import ASREngine
from oasr.models.loader import from_pretrained
from oasr.types import DecodeOptions


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument("--manifest", type=Path, required=True)
    parser.add_argument("--utterances", type=int, default=512)
    parser.add_argument("--rows", type=int, default=None, help="max_combined_encode_rows override")
    args = parser.parse_args()
    loaded = from_pretrained(args.model, device="cuda")
    items = load_manifest(args.manifest, repeat=20)[: args.utterances]
    config = engine_config(8, 256, True)
    engine = ASREngine(loaded, config)
    list(engine.run((f"w{i}", it.audio, DecodeOptions()) for i, it in enumerate(items[:300])))
    runner = engine.runner
    timings = {}
    original_encode = runner._encode

    def timed_encode(rows, requests):
        marks = {}
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        batch = [requests[r.request_id] for r in rows]
        feats = runner.loaded.features([r.audio for r in batch], device=runner.device)
        torch.cuda.synchronize()
        marks["features"] = time.perf_counter() - t0
        t1 = time.perf_counter()
        runner.model.encode(feats)
        torch.cuda.synchronize()
        marks["encoder"] = time.perf_counter() - t1
        t2 = time.perf_counter()
        out = original_encode(rows, requests)
        marks["whole encode walk"] = time.perf_counter() - t2
        for k, v in marks.items():
            timings.setdefault(k, []).append((len(rows), v))
        return out

    runner._encode = timed_encode
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        list(engine.run((f"r{i}", it.audio, DecodeOptions()) for i, it in enumerate(items)))
        wall = time.perf_counter() - start
    print(f"wall {wall:.2f}s for {len(items)} utterances; phases {runner.phase_seconds}")
    for k, v in timings.items():
        rows = sum(r for r, _ in v)
        print(f"{k:20s} calls {len(v):4d} rows {rows:5d} total {sum(t for _, t in v):.3f}s  mean {sum(t for _, t in v) / len(v) * 1000:.1f} ms")
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=25, max_name_column_width=60))
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=15, max_name_column_width=60))


if __name__ == "__main__":
    main()
