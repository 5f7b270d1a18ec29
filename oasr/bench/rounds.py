"""Timed rounds of OASR and a peer at several batch sizes, alternating, and the report the model benches print.

Each peer batch size runs once untimed (after OASR's own warm-up, which the caller does); then every round times
OASR once and the peer at each batch size. The best time of each side counts; the peer's best batch size is the one
reported, with the share of requests whose tokens equal OASR's.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """The options the autoregressive model benches share: the workload, the device, the peer's batch sizes, the
    engine's scheduler, and how the rounds run."""
    parser.add_argument("--num-utterances", type=int, default=1024)
    parser.add_argument("--output-tokens", type=int, default=32)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--peer-batch-sizes", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--max-num-seqs", type=int, default=256)
    # Offline throughput: a deep encoder wants big batches, also beside running decodes (the serving defaults, 16
    # rows beside decodes, favour a newcomer's latency instead).
    parser.add_argument("--max-encode-rows", type=int, default=256)
    parser.add_argument("--max-combined-encode-rows", type=int, default=256)
    parser.add_argument("--min-combined-encode-rows", type=int, default=64)
    # Decode steps between two reads of the tokens: each read empties the device's queue while the host works.
    parser.add_argument("--decode-steps-per-tick", type=int, default=8)
    parser.add_argument("--skip-peer", action="store_true", help="time OASR alone (no transformers rounds)")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="with --skip-peer: also print the N ops that took the most device time")
    parser.add_argument("--rounds", type=int, default=2, help="timed runs of each side, alternating; best counts")


def timed_engine_run(engine, audio: Sequence, options, device) -> tuple[float, dict[str, list[int]]]:
    """One pass of ``audio`` through ``engine`` (requests "r0", "r1", ...) -> (seconds, tokens by request id),
    timed between device synchronisations."""
    import time

    from oasr.bench.parakeet import sync

    sync(device)
    start = time.perf_counter()
    out = {o.request_id: o.token_ids for o in engine.run((f"r{i}", a, options) for i, a in enumerate(audio))}
    sync(device)
    return time.perf_counter() - start, out


OurRun = Callable[[], tuple[float, dict[str, list[int]]]]  # -> (seconds, tokens by request id "r{i}")
PeerRun = Callable[[int], tuple[float, list[list[int]]]]  # batch size -> (seconds, tokens in input order)


@dataclass(frozen=True)
class Rounds:
    our_seconds: tuple[float, ...]
    ours: dict[str, list[int]]  # the last round's tokens
    peer_seconds: dict[int, tuple[float, ...]]
    best_peer_seconds: float
    best_peer_ids: list[list[int]]
    best_batch_size: int


def alternate(run_ours: OurRun, run_peer: PeerRun, batch_sizes: Sequence[int], rounds: int) -> Rounds:
    """Runs the rounds, printing each time to stderr as it comes."""
    for batch_size in batch_sizes:
        run_peer(batch_size)
    our_times: list[float] = []
    peer_times: dict[int, list[float]] = {b: [] for b in batch_sizes}
    best: tuple[float, list[list[int]], int] | None = None
    ours: dict[str, list[int]] = {}
    for _ in range(rounds):
        seconds, ours = run_ours()
        our_times.append(seconds)
        print(f"oasr: {seconds:.3f} s", file=sys.stderr, flush=True)
        for batch_size in batch_sizes:
            seconds, ids = run_peer(batch_size)
            peer_times[batch_size].append(seconds)
            print(f"peer at batch {batch_size}: {seconds:.3f} s", file=sys.stderr, flush=True)
            if best is None or seconds < best[0]:
                best = (seconds, ids, batch_size)
    assert best is not None, "at least one round and one batch size"
    return Rounds(tuple(our_times), ours, {b: tuple(t) for b, t in peer_times.items()}, *best)


def report(header: dict, rounds: Rounds, audio_seconds: float, peer_name: str = "transformers") -> dict:
    """The JSON both sides' numbers go into: ``header`` first, then each side, the speed-up and the agreement."""
    ours = min(rounds.our_seconds)
    theirs = rounds.best_peer_seconds
    same = float(np.mean([rounds.ours[f"r{i}"] == ids for i, ids in enumerate(rounds.best_peer_ids)]))
    return {
        **header,
        "oasr": {"seconds": round(ours, 3), "audio_seconds_per_second": round(audio_seconds / ours, 1),
                 "rounds": [round(t, 3) for t in rounds.our_seconds]},
        peer_name: {"seconds": round(theirs, 3), "batch_size": rounds.best_batch_size,
                    "audio_seconds_per_second": round(audio_seconds / theirs, 1),
                    "rounds": {b: [round(t, 3) for t in ts] for b, ts in rounds.peer_seconds.items()}},
        "speedup": round(theirs / ours, 2),
        "identical_outputs": same,
    }
