"""VAD throughput: audio seconds scored per wall second, batched over streams and for one long stream.

    PYTHONPATH=. python3 scripts/bench_vad.py --device cuda --streams 256 --seconds 60 --long-minutes 60

The audio is the shared English speech clips joined end to end (repeated as needed), so the detector sees real
speech and pauses. Reports, for each detector: many streams in one batch; one long stream in one pass; the same
stream scored as 30 s pieces side by side (silero only), with how many chunk decisions the pieces change; and the
window planner on the long stream.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from speech_data import audio_path, manifest_entries

from oasr.audio import load_audio
from oasr.vad.energy import EnergyVAD
from oasr.vad.planner import WindowPlanner
from oasr.vad.silero import SileroOptions, SileroVAD


def speech(seconds: float) -> np.ndarray:
    clips = [load_audio(audio_path(e)) for e in manifest_entries() if e["language"] == "en"][:20]
    if not clips:
        raise SystemExit("no shared speech data found (set OASR_SPEECH_DATA)")
    joined = np.concatenate(clips)
    return np.resize(joined, int(seconds * 16000)).astype(np.float32)


def timed(fn, device: str) -> float:
    fn()  # warm-up (cuDNN plans, allocator)
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=60.0, help="length of each batched stream")
    parser.add_argument("--long-minutes", type=float, default=60.0, help="length of the single long stream")
    parser.add_argument("--weights", default="jit", choices=("jit", "safetensors"))
    args = parser.parse_args()

    streams = [speech(args.seconds)] * args.streams
    long = speech(args.long_minutes * 60)
    detectors = {
        "silero": SileroVAD.load(args.device, SileroOptions(weights=args.weights)),
        "silero-pieces": SileroVAD.load(args.device, SileroOptions(weights=args.weights, piece_s=30.0)),
        "energy": EnergyVAD.load(args.device),
    }
    exact = detectors["silero"].speech_probs([long])[0]
    for name, detector in detectors.items():
        batch_s = timed(lambda d=detector: d.speech_probs(streams), args.device)
        long_s = timed(lambda d=detector: d.speech_probs([long]), args.device)
        plan_s = timed(lambda d=detector: WindowPlanner(d, 30 * 16000).plan([long]), args.device)
        line = (f"{name:14s} batch {args.streams} x {args.seconds:.0f} s: {args.streams * args.seconds / batch_s:9.0f}x "
                f"real time | one {args.long_minutes:.0f} min stream: {len(long) / 16000 / long_s:8.0f}x "
                f"({long_s:.2f} s) | planning it: {plan_s:.2f} s")
        if name == "silero-pieces":
            flips = ((detector.speech_probs([long])[0] > 0.5) != (exact > 0.5)).mean()
            line += f" | {100 * flips:.2f}% of chunks flip vs one pass"
        print(line, flush=True)
    if args.device == "cuda":
        cpu = SileroVAD.load("cpu", SileroOptions(weights=args.weights)).speech_probs([streams[0]])[0]
        gpu = detectors["silero"].speech_probs([streams[0]])[0]
        print(f"silero GPU vs CPU on one stream: max |dp| = {np.abs(cpu - gpu).max():.2e}")


if __name__ == "__main__":
    main()
