#!/usr/bin/env python3
"""Where the offline diarizer's time goes: random weights at the release shape (or ``--arch tiny``), seeded noise
files of ``--min-seconds``..``--max-seconds``, ``OfflineDiarizer.probabilities`` timed alone, then once under
``torch.profiler``: the top ops by device time and by host time, and the FLOPs the forward needs against the time.

    python scripts/profile_diarization.py --device cuda --files 200
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from oasr.bench.diarization_cost import build_diarization_model, noise_clips
from oasr.diarization.loader import load_diarizer
from oasr.diarization.offline import OfflineDiarizer


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def forward_flops(diarizer: OfflineDiarizer, seconds: list[float]) -> float:
    """The encoder's matrix FLOPs over the frames each step reads (speaker cache and FIFO included)."""
    config = diarizer.loaded.config
    audio, policy = config.audio_config, diarizer.loaded.model.offline_policy
    d, ffn, layers = audio.hidden_size, audio.intermediate_size, audio.num_hidden_layers
    per_frame = 2 * layers * (4 * d * d + 2 * d * ffn)
    frames_read = 0
    for s in seconds:
        frames = int(s * 100) // audio.subsampling_factor
        chunks = -(-frames // config.chunk_length)
        cached = min(policy.cache_length + policy.fifo_length, frames)
        frames_read += frames + chunks * (cached + config.chunk_right_context)
    return per_frame * frames_read


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", default="release", choices=("release", "tiny"))
    p.add_argument("--device", default="cuda")
    p.add_argument("--files", type=int, default=200)
    p.add_argument("--min-seconds", type=float, default=30.0)
    p.add_argument("--max-seconds", type=float, default=120.0)
    p.add_argument("--max-batch-seconds", type=float, default=7200.0)
    p.add_argument("--rows", type=int, default=25, help="rows of each profiler table")
    args = p.parse_args()
    seconds = list(np.random.default_rng(0).uniform(args.min_seconds, args.max_seconds, args.files))
    audio = noise_clips(seconds, seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        build_diarization_model(args.arch, Path(tmp))
        diarizer = OfflineDiarizer(load_diarizer(Path(tmp), device=args.device), args.max_batch_seconds)
    diarizer.probabilities(audio[: min(8, len(audio))])
    sync(args.device)
    start = time.perf_counter()
    diarizer.probabilities(audio)
    sync(args.device)
    wall = time.perf_counter() - start
    flops = forward_flops(diarizer, seconds)
    print(f"{args.files} files, {sum(seconds):.0f} s of audio: {wall:.3f} s, {sum(seconds) / wall:.0f}x real time; "
          f"encoder matrix work {flops / 1e12:.1f} TFLOP, {flops / wall / 1e12:.1f} TFLOP/s")
    activities = [torch.profiler.ProfilerActivity.CPU]
    if args.device.startswith("cuda"):
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        diarizer.probabilities(audio)
        sync(args.device)
    averages = prof.key_averages()
    if args.device.startswith("cuda"):
        print(averages.table(sort_by="self_cuda_time_total", row_limit=args.rows, max_name_column_width=60))
    print(averages.table(sort_by="self_cpu_time_total", row_limit=args.rows, max_name_column_width=60))


if __name__ == "__main__":
    main()
