"""Realtime load: N concurrent ``/v1/realtime`` transcription sessions against a real ``oasr serve``, each
streaming its utterances in (simulated) real time and committing one turn per utterance; the latencies its
clients see, and the server's own histograms over the same run.

    oasr bench realtime --model tiny.en --sessions 64 --manifest shared/data/speech/manifest.jsonl --device cuda
    oasr bench realtime --nemotron-shape --sessions 256 --synthetic-seconds 8 --device cuda
    # turns beside whole-file uploads (a turn goes ahead of them: the engine's request priority)
    oasr bench realtime --model tiny.en --sessions 64 --manifest M --bulk-uploads 16 --device cuda

``--nemotron-shape`` serves random weights of the published Nemotron streaming 0.6b shape (``oasr.bench.stream``
builds them into a temporary directory). Its joint's blank logit is raised by ``--blank-bias``: at the stream
bench's 1.0 these random weights emit nothing on the synthetic clips, so no delta would be timed; at the default
0.7 they emit tokens on most clips, and many (hundreds in 8 s, against a trained model's few dozen), so the
decode work and the delta count are a pessimistic load, not a typical one. Audio is the manifest's clips (JSONL
with ``audio``, a path relative to the manifest) or seeded synthetic clips (tones under noise), sent as 24 kHz
PCM16 in ``--chunk-ms`` appends.
Measured by the clients (``time.perf_counter``), p50 / p90 / p99 in seconds:

- ``completion``: the commit sent -> the turn's ``completed`` received.
- ``first_delta_after_commit``: the commit sent -> the turn's first delta after it (an offline model's deltas
  all come after the commit).
- ``first_partial``: a turn's first append sent -> its first delta (a streaming model speaks while it hears).
- ``delta_after_last_append`` (streaming models): each delta's arrival less the send time of the turn's latest
  append before it. The delta is about audio sent no later than that append, so this is a lower bound on the
  delta's latency.

The server's ``oasr_realtime_delta_seconds`` (a streamed delta's audio arriving -> the delta sent) and
``oasr_realtime_completion_seconds`` histograms are scraped from /metrics before and after the run and their
difference read as p50 / p99, interpolated within buckets as Prometheus' ``histogram_quantile`` does (so no finer
than the buckets). With ``--bulk-uploads N``, N clients post whole files
(``--bulk-seconds`` of the clips repeated) throughout the measured load (``oasr.bench.bulk_uploads``), and
``bulk`` reports their answers. A clean run has no errors, no failed upload and every turn completed;
``pacing.fell_behind`` says whether any append went out more than one chunk period after its due time (then the
client, not the server, set the pace). ``--api-workers N`` serves the sessions from N HTTP worker processes
sharing the one engine core (``oasr serve --api-workers``), so that one event loop does not carry every session's
appends and deltas. ``--profile-core PATH`` runs the server's engine core loop under cProfile
(``OASR_CORE_PROFILE``) and prints its busiest functions after the run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np

from oasr.bench.bulk_uploads import beside_bulk, bulk_wav
from oasr.bench.realtime_client import ENGINE_RATE, LoadPlan, SessionRecord, Utterance, run_load, utterance
from oasr.bench.serve_load import manifest_rows, percentiles
from oasr.bench.server_process import free_port, running_server, serve_command, tail
from oasr.hosting.loop import PROFILE_ENV
from oasr.models.catalogue import MODEL_HELP
from oasr.devices import DEVICE_HELP, device_name

NEMOTRON_ARCH = "nemotron-streaming-0.6b"
# Measured on CPU over the 8 synthetic 8 s clips: 1.0 and 0.8 emit no token on any, 0.75 on three, 0.7 on seven
# (10 to 900 tokens each), 0.6 on all eight (about 900 each).
REALTIME_BLANK_BIAS = 0.7
NUM_SYNTHETIC_CLIPS = 8
DEFAULT_TURNS = 4  # per session, when neither --turns-per-session nor --duration-s is given
WARMUP_SPEED = 4.0  # the warm-up's turns go faster than real time: they are not measured
SESSIONS_PER_CLIENT_PROCESS = 64  # one client loop keeps 64 sessions on time; 256 fell behind by 200 ms


def synthetic_audio(count: int, seconds: float, seed: int = 0) -> list[np.ndarray]:
    """Seeded 16 kHz clips: a few tones under a syllable-rate envelope, over quiet noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * ENGINE_RATE)) / ENGINE_RATE
    clips = []
    for _ in range(count):
        tones = sum(np.sin(2 * np.pi * f * t + rng.uniform(0, 2 * np.pi)) for f in rng.uniform(120, 900, size=3))
        envelope = 0.5 + 0.5 * np.sin(2 * np.pi * rng.uniform(3, 5) * t)
        clips.append((0.08 * tones * envelope + 0.01 * rng.standard_normal(len(t))).astype(np.float32))
    return clips


def load_clips(args: argparse.Namespace) -> list[tuple[str, np.ndarray]]:
    """The manifest's clips, or the seeded synthetic ones, as (name, 16 kHz samples)."""
    if args.manifest is not None:
        from oasr.audio import load_audio

        named = [(Path(r["audio"]).name, load_audio(r["audio"])) for r in manifest_rows(args.manifest)]
    else:
        named = [(f"synthetic-{i}", a) for i, a in
                 enumerate(synthetic_audio(NUM_SYNTHETIC_CLIPS, args.synthetic_seconds))]
    if not named:
        raise SystemExit(f"oasr bench realtime: {args.manifest} lists no audio")
    return named


# ------------------------------------------------------------------------------------ server metrics

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str) -> Samples:
    """/metrics as {(sample name, sorted labels): value}."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", timeout=30).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def bucket_difference(before: Samples, after: Samples, name: str) -> list[tuple[float, float]]:
    """Histogram ``name``'s cumulative buckets over the run: [(upper bound, count)], ascending, +Inf last."""
    key = f"{name}_bucket"
    return sorted((float(dict(labels)["le"]), value - before.get((sample, labels), 0.0))
                  for (sample, labels), value in after.items() if sample == key)


def histogram_quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """The ``q`` quantile of cumulative ``buckets``, linear within the bucket it falls in (from 0 for the first);
    the largest finite bound when it falls in +Inf; None when the histogram is empty."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for upper, cumulative in buckets:
        if cumulative >= rank:
            if np.isinf(upper):
                return lower
            return lower + (upper - lower) * (rank - below) / (cumulative - below) if cumulative > below else lower
        lower, below = upper, cumulative
    return lower


def server_histogram(before: Samples, after: Samples, name: str) -> dict[str, float | None]:
    buckets = bucket_difference(before, after, name)
    count = buckets[-1][1] if buckets else 0.0
    return {"count": int(count), **{f"p{q}": None if (v := histogram_quantile(buckets, q / 100)) is None
                                    else round(v, 4) for q in (50, 99)}}


def _value(samples: Samples, name: str) -> float:
    return samples.get((name, ()), 0.0)


# ------------------------------------------------------------------------------------ the run

def _plan(args: argparse.Namespace, ws_url: str, utterances: tuple[Utterance, ...]) -> LoadPlan:
    num_turns = args.turns_per_session
    if num_turns is None and args.duration_s is None:
        num_turns = DEFAULT_TURNS
    return LoadPlan(ws_url, utterances, args.sessions, num_turns, args.duration_s, args.chunk_ms / 1000,
                    args.speed, args.turn_timeout_s, args.stagger_s)


def client_processes(args: argparse.Namespace) -> int:
    return min(args.client_processes or -(-args.sessions // SESSIONS_PER_CLIENT_PROCESS), args.sessions)


def _serve_args(args: argparse.Namespace, model: str, port: int) -> list[str]:
    sessions = max(args.sessions + args.warmup_sessions, 64)  # the warm-up's may still be closing
    # The bench's sessions all come from one address and no key: the per-client and per-key caps are off.
    return serve_command("--model", model, "--port", str(port), "--device", args.device, "--dtype", args.dtype,
                         "--max-queue", "4096", "--max-queue-per-client", "0", "--max-queue-per-key", "0",
                         "--realtime-max-sessions", str(sessions), "--max-streams", str(sessions),
                         "--realtime-max-sessions-per-client", "0", "--realtime-max-sessions-per-key", "0",
                         "--api-workers", str(args.api_workers))


def bench(args: argparse.Namespace) -> dict:
    clips = load_clips(args)
    utterances = tuple(utterance(name, samples, args.chunk_ms) for name, samples in clips)
    port = args.port or free_port()
    url = f"http://127.0.0.1:{port}"
    plan = _plan(args, f"ws://127.0.0.1:{port}/v1/realtime?intent=transcription", utterances)
    log_path = Path(tempfile.gettempdir()) / f"oasr-bench-realtime-{port}.log"
    env = {k: v for k, v in os.environ.items() if k != "OASR_API_KEY"}  # the bench sends no key
    if args.profile_core is not None:
        env[PROFILE_ENV] = str(args.profile_core)
    with contextlib.ExitStack() as stack:
        model = args.model
        if args.nemotron_shape:
            from oasr.bench.stream import build

            model = stack.enter_context(tempfile.TemporaryDirectory(prefix="oasr-nemotron-shape-"))
            print(f"# building random {NEMOTRON_ARCH} weights in {model}", file=sys.stderr, flush=True)
            build(NEMOTRON_ARCH, Path(model), blank_bias=args.blank_bias)
        command = _serve_args(args, model, port)
        print(f"# server: {' '.join(command[1:])}; log {log_path}", file=sys.stderr, flush=True)
        stack.enter_context(running_server(command, url, log_path, env=env))
        if args.warmup_sessions:
            warmup = replace(plan, num_sessions=args.warmup_sessions, num_turns=1, duration_s=None,
                             speed=max(args.speed, WARMUP_SPEED))
            records, _ = asyncio.run(run_load(warmup))
            failures = [e for r in records for e in r.errors]
            if failures:
                raise RuntimeError(f"the warm-up failed: {failures[:3]}; the server log ({log_path}) ends:\n"
                                   f"{tail(log_path)}")
        before = scrape(url)
        bulk = None
        processes = client_processes(args)
        if args.bulk_uploads:
            wav = bulk_wav([samples for _, samples in clips], args.bulk_seconds)
            (records, wall_s), bulk = asyncio.run(beside_bulk(run_load(plan, processes=processes), url, wav,
                                                              args.bulk_uploads))
        else:
            records, wall_s = asyncio.run(run_load(plan, processes=processes))
        after = scrape(url)
    out = report(args, plan, records, wall_s, before, after)
    if args.profile_core is not None:  # the server has stopped: its core wrote its statistics as its loop ended
        out["core_profiles"] = print_profiles(args.profile_core)
    if bulk is not None:  # the uploads' own answers; a failed one makes the run unclean
        out["bulk"] = bulk.summary(args.bulk_uploads, args.bulk_seconds)
        out["clean"] = out["clean"] and not bulk.errors
    return out


def print_profiles(path: Path, top: int = 30) -> list[str]:
    """The core loops' statistics written to ``path``.<pid>: their busiest functions (own time) to stderr;
    -> the files."""
    import pstats

    files = sorted(str(f) for f in path.parent.glob(f"{path.name}.*"))
    for name in files:
        print(f"== core profile {name}", file=sys.stderr)
        pstats.Stats(name, stream=sys.stderr).sort_stats("tottime").print_stats(top)
    return files


def report(args: argparse.Namespace, plan: LoadPlan, records: list[SessionRecord], wall_s: float,
           before: Samples, after: Samples) -> dict:
    turns = [t for r in records for t in r.turns]
    done = [t for t in turns if t.completed]
    errors = [e for r in records for e in r.errors]
    streams = _value(before, "oasr_engine_stream_slots") > 0
    latency = {
        "completion": percentiles([t.completed_at - t.commit_at for t in done]),
        "first_delta_after_commit": percentiles([min(d for d in t.delta_times if d >= t.commit_at) - t.commit_at
                                                 for t in done if any(d >= t.commit_at for d in t.delta_times)]),
        "first_partial": percentiles([t.delta_times[0] - t.first_append_at for t in turns if t.delta_times]),
    }
    if streams:
        latency["delta_after_last_append"] = percentiles([x for t in turns for x in t.delta_after_append_s])
    expected = None if plan.num_turns is None or plan.duration_s is not None else plan.num_sessions * plan.num_turns
    behind = [r for r in records if r.num_late_appends]
    out: dict = {
        "model": NEMOTRON_ARCH + " (random weights)" if args.nemotron_shape else args.model,
        "model_streams": streams, "device": args.device, "sessions": plan.num_sessions,
        "turns_per_session": plan.num_turns, "duration_s": plan.duration_s, "chunk_ms": args.chunk_ms,
        "speed": plan.speed, "clips": len(plan.utterances), "client_processes": client_processes(args),
        "api_workers": args.api_workers,
        "wall_s": round(wall_s, 3),
        "turns_started": len(turns), "turns_completed": len(done), "turns_expected": expected,
        "sessions_completed": sum(not r.errors and (expected is None or len(r.turns) == plan.num_turns)
                                  for r in records),
        "errors": len(errors), "first_errors": errors[:5],
        "audio_s_streamed": round(sum(r.audio_sent_s for r in records), 3),
        "deltas": sum(len(t.delta_times) for t in turns),
        "latency_s": latency,
        "server": {
            "completion_s": server_histogram(before, after, "oasr_realtime_completion_seconds"),
            "delta_s": server_histogram(before, after, "oasr_realtime_delta_seconds"),
            "audio_s_received": round(_value(after, "oasr_realtime_audio_seconds_total")
                                      - _value(before, "oasr_realtime_audio_seconds_total"), 3),
        },
        "pacing": {"max_lateness_s": round(max((r.max_lateness_s for r in records), default=0.0), 4),
                   "late_appends": sum(r.num_late_appends for r in records), "sessions_behind": len(behind),
                   "fell_behind": bool(behind)},
    }
    out["clean"] = not errors and len(done) == len(turns) and (expected is None or len(done) == expected)
    if args.transcripts:
        out["transcripts"] = [
            {"session": r.index, "turn": k, "clip": plan.utterances[t.utterance].name,
             "audio_s": round(plan.utterances[t.utterance].audio_s, 3), "transcript": t.transcript,
             "completion_s": None if t.completed_at is None or t.commit_at is None
             else round(t.completed_at - t.commit_at, 4)}
            for r in records for k, t in enumerate(r.turns)]
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="oasr bench realtime", description=__doc__.split("\n\n")[0])
    model = p.add_mutually_exclusive_group()
    model.add_argument("--model", default="tiny.en", help="the served model: " + MODEL_HELP.removeprefix("a model: "))
    model.add_argument("--nemotron-shape", action="store_true",
                       help=f"serve random weights of the {NEMOTRON_ARCH} shape (needs transformers' Nemotron)")
    p.add_argument("--blank-bias", type=float, default=REALTIME_BLANK_BIAS,
                   help="with --nemotron-shape: added to the random joint's blank logit (lower: more tokens)")
    audio = p.add_mutually_exclusive_group()
    audio.add_argument("--manifest", type=Path, default=None, help="JSONL with 'audio', relative to the manifest")
    audio.add_argument("--synthetic-seconds", type=float, default=8.0,
                       help=f"without --manifest: {NUM_SYNTHETIC_CLIPS} synthetic clips of this length")
    p.add_argument("--sessions", type=int, default=64)
    p.add_argument("--turns-per-session", type=int, default=None,
                   help=f"turns each session speaks (default {DEFAULT_TURNS}, or until --duration-s)")
    p.add_argument("--duration-s", type=float, default=None, help="no session starts a turn after this long")
    p.add_argument("--chunk-ms", type=int, default=100, help="audio per input_audio_buffer.append")
    p.add_argument("--speed", type=float, default=1.0, help="audio seconds sent per wall second (1: real time)")
    p.add_argument("--stagger-s", type=float, default=1.0, help="sessions start spread over this long")
    p.add_argument("--client-processes", type=int, default=None,
                   help=f"client processes the sessions are split over (default: one per "
                        f"{SESSIONS_PER_CLIENT_PROCESS} sessions; one loop with hundreds falls behind its pacing)")
    p.add_argument("--api-workers", type=int, default=1,
                   help="the server's HTTP worker processes (oasr serve --api-workers): its sessions spread over them")
    p.add_argument("--profile-core", type=Path, default=None,
                   help="profile the server's engine core loop (OASR_CORE_PROFILE): its statistics go to "
                        "PROFILE_CORE.<pid>, and its busiest functions to stderr after the run")
    p.add_argument("--warmup-sessions", type=int, default=8, help="sessions of one turn each before measuring")
    p.add_argument("--turn-timeout-s", type=float, default=300.0, help="a turn not completed by then has failed")
    p.add_argument("--device", default="auto", type=device_name, help=DEVICE_HELP)
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "float16", "bfloat16"))
    p.add_argument("--port", type=int, default=0, help="the server's port (0: a free one)")
    p.add_argument("--transcripts", action="store_true", help="list every turn's clip, audio length, transcript and completion time in the JSON")
    p.add_argument("--bulk-uploads", type=int, default=0,
                   help="clients posting whole files to /v1/audio/transcriptions throughout the measured load, "
                        "the bulk work turns must not queue behind")
    p.add_argument("--bulk-seconds", type=float, default=120.0, help="audio per bulk upload (the clips repeated)")
    p.add_argument("--json-out", type=Path, default=None)
    args = p.parse_args(argv)
    if args.client_processes is not None and args.client_processes < 1:
        p.error("--client-processes must be at least 1")
    if args.api_workers < 1:
        p.error("--api-workers must be at least 1")
    if args.sessions < 1 or args.chunk_ms < 1 or args.speed <= 0 or args.stagger_s < 0:
        p.error("--sessions and --chunk-ms must be positive, --speed above 0, --stagger-s at least 0")
    if args.turns_per_session is not None and args.turns_per_session < 1:
        p.error("--turns-per-session must be at least 1")
    if args.bulk_uploads < 0 or args.bulk_seconds <= 0:
        p.error("--bulk-uploads must be at least 0 and --bulk-seconds above 0")
    return args


def main(argv: list[str] | None = None) -> int:
    """Prints the run's JSON; 0 for a clean run (no errors, every turn completed), else 1."""
    args = parse_args(argv)
    result = bench(args)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json_out:
        args.json_out.write_text(text + "\n")
    return 0 if result["clean"] else 1


if __name__ == "__main__":
    sys.exit(main())
