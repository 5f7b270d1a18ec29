"""gRPC against realtime: one real ``oasr serve`` with ``--grpc-port``, N concurrent Riva ``StreamingRecognize``
streams (interim results on) and then the same N streams over ``/v1/realtime``, each sending one clip in
real time; the interim and final latencies each front end's clients see, in one run on one server.

On the H200 (issue 37: 256 streams at the Nemotron streaming shape, random weights):

    python -m oasr.bench.grpc_streams --arch nemotron-streaming-0.6b --streams 256 --chunk-ms 160 \\
        --seconds 8 --device cuda --json-out grpc-vs-realtime.json
    # Riva's usual 100 ms chunks: the same with --chunk-ms 100 --json-out grpc-vs-realtime-100ms.json

The client speaks the Riva protocol through OASR's own generated stubs (``oasr.serving.grpc.protos``), on
``grpc.aio``, so no ``nvidia-riva-client`` is needed. Audio is the realtime bench's seeded synthetic clips; the
weights are random at ``--arch``'s shape (``tiny``: the registry's tiny Nemotron streaming config, for CI), the
joint's blank logit raised by ``--blank-bias`` as in ``oasr bench realtime``. Both front ends run the same model
stream in the engine; only the transport and its framing differ.

Measured by the clients (``time.perf_counter``), p50 / p99 in seconds:

- ``interim``: each interim result's (gRPC) or delta's (realtime) arrival less the send time of the latest audio
  chunk before it: a lower bound on that result's latency, the same on both sides.
- ``final``: the end of the audio (gRPC: the client half-closes; realtime: the commit) -> the stream's last
  result (gRPC: the call ends, all finals in; realtime: the turn's ``completed``).

``interim`` and ``finals`` count results with text (gRPC sends no final for an empty transcript; a realtime
turn's ``completed`` always comes, and counts when its transcript has text). ``max_send_lateness_s``: the latest
any chunk went out after its due time; well under a chunk period means the client kept real time (else the
client, not the server, set the pace). A stream "completed" when its call ended OK (gRPC) or its turn completed
(realtime). Prints one JSON line; exit status 0 when every stream of both front ends completed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from oasr.bench.realtime import NEMOTRON_ARCH, REALTIME_BLANK_BIAS, synthetic_audio
from oasr.bench.realtime_client import ENGINE_RATE, LoadPlan, run_load, utterance
from oasr.bench.serve_load import percentiles
from oasr.bench.server_process import free_port, running_server, serve_command, tail
from oasr.devices import DEVICE_HELP, device_name

ARCHES = (NEMOTRON_ARCH, "tiny")
NUM_CLIPS = 8


def tiny_nemotron_shape() -> dict:
    """The registry's tiny Nemotron streaming config, laid out as ``oasr.bench.stream.NEMOTRON_SHAPES``."""
    from oasr.models import ARCHITECTURES

    config = ARCHITECTURES.get("nemotron_asr_streaming").tiny_config().to_dict()
    encoder = config["encoder_config"]
    keys = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "conv_kernel_size",
            "subsampling_conv_channels", "num_mel_bins", "sliding_window", "default_num_lookahead_tokens")
    head = ("vocab_size", "blank_token_id", "pad_token_id", "decoder_hidden_size", "num_decoder_layers")
    return dict(encoder={k: encoder[k] for k in keys}, head={k: config[k] for k in head})


def build_model(arch: str, directory: Path, blank_bias: float) -> None:
    """Random streaming weights of ``arch`` in ``directory``, ready for ``oasr serve --model``."""
    from oasr.bench.stream import build

    if arch == "tiny":
        build(NEMOTRON_ARCH, directory, blank_bias=blank_bias, shape=tiny_nemotron_shape())
    else:
        build(arch, directory, blank_bias=blank_bias)


# ------------------------------------------------------------------------------------ the gRPC clients

@dataclass
class GrpcRecord:
    index: int
    interim_after_chunk_s: list[float] = field(default_factory=list)
    num_interim: int = 0
    num_final: int = 0
    half_closed_at: float | None = None
    ended_at: float | None = None
    error: str | None = None
    max_lateness_s: float = 0.0  # the latest a chunk went out after its due time (the client's own pace)

    @property
    def completed(self) -> bool:
        return self.error is None and self.ended_at is not None


def _streaming_config():
    from oasr.serving.grpc.protos import riva_asr_pb2, riva_audio_pb2

    config = riva_asr_pb2.RecognitionConfig(encoding=riva_audio_pb2.AudioEncoding.LINEAR_PCM,
                                            sample_rate_hertz=ENGINE_RATE, audio_channel_count=1,
                                            language_code="en-US", max_alternatives=1)
    return riva_asr_pb2.StreamingRecognizeRequest(
        streaming_config=riva_asr_pb2.StreamingRecognitionConfig(config=config, interim_results=True))


async def _grpc_stream(stub, record: GrpcRecord, chunks: list[bytes], chunk_s: float, start_at: float,
                       timeout_s: float) -> None:
    import grpc

    from oasr.serving.grpc.protos import riva_asr_pb2

    last_sent = [0.0]

    async def requests():
        yield _streaming_config()
        start = time.perf_counter()
        for k, chunk in enumerate(chunks):
            due = start + k * chunk_s
            await asyncio.sleep(max(due - time.perf_counter(), 0.0))
            record.max_lateness_s = max(record.max_lateness_s, time.perf_counter() - due)
            yield riva_asr_pb2.StreamingRecognizeRequest(audio_content=chunk)
            last_sent[0] = time.perf_counter()
        await asyncio.sleep(max(start + len(chunks) * chunk_s - time.perf_counter(), 0.0))
        record.half_closed_at = time.perf_counter()

    await asyncio.sleep(max(start_at - time.perf_counter(), 0.0))
    try:
        async for response in stub.StreamingRecognize(requests(), timeout=timeout_s):
            now = time.perf_counter()
            for result in response.results:
                if result.is_final:
                    record.num_final += 1
                else:
                    record.num_interim += 1
                    record.interim_after_chunk_s.append(now - last_sent[0])
        record.ended_at = time.perf_counter()
    except grpc.aio.AioRpcError as exc:
        record.error = f"stream {record.index}: {exc.code().name}: {exc.details()}"


async def run_grpc_load(uri: str, clips: list[np.ndarray], num_streams: int, chunk_ms: int, stagger_s: float,
                        timeout_s: float) -> tuple[list[GrpcRecord], float]:
    """``num_streams`` concurrent calls, stream i sending clip ``i % len(clips)`` in real time."""
    import grpc

    from oasr.serving.grpc.protos import riva_asr_pb2_grpc

    chunk_samples = ENGINE_RATE * chunk_ms // 1000
    pcm = [(np.clip(np.round(c * 32768), -32768, 32767).astype("<i2")) for c in clips]
    pieces = [[p[i : i + chunk_samples].tobytes() for i in range(0, len(p), chunk_samples)] for p in pcm]
    records = [GrpcRecord(i) for i in range(num_streams)]
    # One channel per stream: a shared one multiplexes every call over one HTTP/2 connection, which the realtime
    # side (a socket per session) does not get either.
    channels = [grpc.aio.insecure_channel(uri) for _ in range(num_streams)]
    started = time.perf_counter()
    try:
        await asyncio.gather(*(
            _grpc_stream(riva_asr_pb2_grpc.RivaSpeechRecognitionStub(channels[r.index]), r,
                         pieces[r.index % len(pieces)], chunk_ms / 1000,
                         started + stagger_s * r.index / num_streams, timeout_s) for r in records))
    finally:
        await asyncio.gather(*(c.close() for c in channels))
    return records, time.perf_counter() - started


# ------------------------------------------------------------------------------------ the run

def _serve_args(args: argparse.Namespace, model: str, port: int, grpc_port: int) -> list[str]:
    sessions = max(args.streams + args.warmup_streams, 64)  # the warm-up's may still be closing
    return serve_command("--model", model, "--port", str(port), "--grpc-port", str(grpc_port),
                         "--device", args.device, "--dtype", args.dtype, "--max-queue", "4096",
                         "--max-queue-per-client", "0", "--max-queue-per-key", "0",
                         "--realtime-max-sessions", str(sessions), "--max-streams", str(sessions),
                         "--realtime-max-sessions-per-client", "0", "--realtime-max-sessions-per-key", "0")


def bench(args: argparse.Namespace) -> dict:
    clips = synthetic_audio(NUM_CLIPS, args.seconds)
    utterances = tuple(utterance(f"synthetic-{i}", c, args.chunk_ms) for i, c in enumerate(clips))
    port, grpc_port = (args.port or free_port()), free_port()
    url, uri = f"http://127.0.0.1:{port}", f"127.0.0.1:{grpc_port}"

    def plan(num: int) -> LoadPlan:
        return LoadPlan(f"ws://127.0.0.1:{port}/v1/realtime?intent=transcription", utterances, num, 1, None,
                        args.chunk_ms / 1000, 1.0, args.timeout_s, args.stagger_s)

    log_path = Path(tempfile.gettempdir()) / f"oasr-bench-grpc-{port}.log"
    env = {k: v for k, v in os.environ.items() if k != "OASR_API_KEY"}  # the bench sends no key
    with contextlib.ExitStack() as stack:
        model = stack.enter_context(tempfile.TemporaryDirectory(prefix="oasr-grpc-bench-"))
        print(f"# building random {args.arch} streaming weights in {model}", file=sys.stderr, flush=True)
        build_model(args.arch, Path(model), args.blank_bias)
        command = _serve_args(args, model, port, grpc_port)
        print(f"# server: {' '.join(command[1:])}; log {log_path}", file=sys.stderr, flush=True)
        stack.enter_context(running_server(command, url, log_path, env=env))
        if args.warmup_streams:  # both paths once, so neither side pays first-use costs in its timing
            asyncio.run(run_grpc_load(uri, clips, args.warmup_streams, args.chunk_ms, 0.0, args.timeout_s))
            asyncio.run(run_load(plan(args.warmup_streams)))
        grpc_records, grpc_wall = asyncio.run(run_grpc_load(uri, clips, args.streams, args.chunk_ms,
                                                            args.stagger_s, args.timeout_s))
        realtime_records, realtime_wall = asyncio.run(run_load(plan(args.streams)))
        if any(not r.completed for r in grpc_records) or any(r.errors for r in realtime_records):
            print(f"# the server log ({log_path}) ends:\n{tail(log_path)}", file=sys.stderr, flush=True)
    return report(args, grpc_records, grpc_wall, realtime_records, realtime_wall)


def report(args: argparse.Namespace, grpc_records: list[GrpcRecord], grpc_wall: float, realtime_records,
           realtime_wall: float) -> dict:
    turns = [t for r in realtime_records for t in r.turns]
    grpc_errors = [r.error for r in grpc_records if r.error]
    realtime_errors = [e for r in realtime_records for e in r.errors]
    grpc_side = {
        "streams_completed": sum(r.completed for r in grpc_records),
        "interim": sum(r.num_interim for r in grpc_records), "finals": sum(r.num_final for r in grpc_records),
        "errors": len(grpc_errors), "first_errors": grpc_errors[:5], "wall_s": round(grpc_wall, 3),
        "max_send_lateness_s": round(max((r.max_lateness_s for r in grpc_records), default=0.0), 4),
        "latency_s": {"interim": percentiles([x for r in grpc_records for x in r.interim_after_chunk_s]),
                      "final": percentiles([r.ended_at - r.half_closed_at for r in grpc_records
                                            if r.completed and r.half_closed_at is not None])},
    }
    realtime_side = {
        "streams_completed": sum(1 for r in realtime_records if not r.errors and r.turns and r.turns[0].completed),
        "interim": sum(len(t.delta_times) for t in turns),
        "finals": sum(t.completed and bool((t.transcript or "").strip()) for t in turns),
        "errors": len(realtime_errors), "first_errors": realtime_errors[:5], "wall_s": round(realtime_wall, 3),
        "max_send_lateness_s": round(max((r.max_lateness_s for r in realtime_records), default=0.0), 4),
        "latency_s": {"interim": percentiles([x for t in turns for x in t.delta_after_append_s]),
                      "final": percentiles([t.completed_at - t.commit_at for t in turns if t.completed])},
    }
    clean = grpc_side["streams_completed"] == realtime_side["streams_completed"] == args.streams
    return {"bench": "grpc_streams", "arch": args.arch, "weights": "random", "device": args.device,
            "dtype": args.dtype, "streams": args.streams, "chunk_ms": args.chunk_ms, "seconds": args.seconds,
            "grpc": grpc_side, "realtime": realtime_side, "clean": clean}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m oasr.bench.grpc_streams", description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", default=NEMOTRON_ARCH, choices=ARCHES,
                   help="the random model's shape (tiny: the registry's tiny config, for CPU smoke runs)")
    p.add_argument("--streams", type=int, default=256, help="concurrent streams on each front end")
    p.add_argument("--chunk-ms", type=int, default=160, choices=(100, 160), help="audio per message")
    p.add_argument("--seconds", type=float, default=8.0, help="audio per stream")
    p.add_argument("--blank-bias", type=float, default=REALTIME_BLANK_BIAS,
                   help="added to the random joint's blank logit (lower: more tokens, so more interim results)")
    p.add_argument("--stagger-s", type=float, default=1.0, help="streams start spread over this long")
    p.add_argument("--warmup-streams", type=int, default=8, help="streams on each front end before measuring")
    p.add_argument("--timeout-s", type=float, default=300.0, help="a stream not done by then has failed")
    p.add_argument("--device", default="auto", type=device_name, help=DEVICE_HELP)
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "float16", "bfloat16"))
    p.add_argument("--port", type=int, default=0, help="the server's HTTP port (0: a free one)")
    p.add_argument("--json-out", type=Path, default=None)
    args = p.parse_args(argv)
    if args.streams < 1 or args.seconds <= 0 or args.stagger_s < 0 or args.warmup_streams < 0:
        p.error("--streams must be positive, --seconds above 0, --stagger-s and --warmup-streams at least 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = bench(args)
    print(json.dumps(result))
    if args.json_out:
        args.json_out.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["clean"] else 1


if __name__ == "__main__":
    sys.exit(main())
