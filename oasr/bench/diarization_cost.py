"""What speaker diarization costs beside ASR, with random weights at the release shapes (issue 36):

- live: N diarization streams (``oasr.diarization.streams.DiarizationStreams``) beside N Nemotron streaming ASR
  streams (``StreamingEngine``), on one device, one loop stepping both, every stream pushing ``--chunk-ms`` of
  audio per chunk period in real time; the per-chunk latency of each, p50 / p99.
- offline: M files of 30-120 s (seeded lengths) through the engine core (``start_inproc``, as ``oasr serve
  --engine-mode thread`` runs it), all submitted at once: ASR alone, then each file transcribed and diarized
  (the core batches the ``Diarize`` messages between its steps, as for ``diarized_json``); the throughput of
  each and ``diarization_cost`` = ASR-alone throughput / throughput with diarization - 1 (target: under 0.2).

On the H200 (defaults: N=256, M=1000, the Nemotron streaming 0.6b and Nemotron-3-Diarization shapes):

    python -m oasr.bench.diarization_cost --device cuda --json-out diarization-cost.json
    # either half alone: --skip-offline / --skip-live; fewer files: --files 200

Shapes: ASR, ``oasr.bench.stream.NEMOTRON_SHAPES`` (``tiny``: the registry's tiny config); diarization,
transformers' ``Nemotron3DiarizationConfig()`` defaults, the release's shape (``tiny``: the registry's tiny
config), built through OASR's own module (the GPU machine's transformers 5.17 has no Nemotron 3 Diarization).
Random weights make the speakers' probabilities noise: every speaker switches on and off about every frame, a
hundred segments a second of audio, and turning those into segments (``speaker_segments``, the live segment
tracker) is host work on the loop's thread: timed on a CPU, about all the time diarization added on an H100,
while the device waited. ``--speaker-activity steady`` (the default) therefore sets the speaker classifier's
last layer so that speaker 0 talks throughout and the others never (its logits still move with the input, by a
quarter of their random spread, never near the threshold): one segment per file or stream, host work of the
order of a conversation's few turns. ``noise`` keeps the random classifier. The forwards, which the timing is
about, are the release's either way. Audio is seeded noise.

Per-chunk latency, ASR: from when the last sample a chunk reads (with its look-ahead) was sent to the end of the
step that decoded it (as ``oasr bench stream``); diarization likewise for each chunk's scored frames and their
look-ahead. Live diarization runs here in the bench's loop: the server has no live diarization path yet, so this
measures the engine objects side by side, not a transport.

Prints one JSON line; exit status 0 when every stream and file got its final result.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from oasr.bench.grpc_streams import build_model
from oasr.bench.serve_load import percentiles
from oasr.devices import DEVICE_HELP, device_name

ASR_ARCHES = ("nemotron-streaming-0.6b", "tiny")
DIARIZATION_ARCHES = ("release", "tiny")
SPEAKER_ACTIVITY = ("steady", "noise")
STEADY_LOGIT = 4.0  # the steady classifier's bias: speaker 0 at +4, the others at -4 (probabilities 0.98 / 0.02)
SAMPLE_RATE = 16_000


def build_diarization_model(arch: str, directory: Path, seed: int = 0, activity: str = "noise") -> None:
    """A random Nemotron 3 Diarization checkpoint in ``directory``, laid out as transformers' ``save_pretrained``
    writes one (``config.json`` and ``model.safetensors``; OASR's modules carry its key names): the release's shape
    (OASR's config defaults, which are transformers' ``Nemotron3DiarizationConfig()`` defaults), or the registry's
    tiny config. Built through OASR's own module, as the GPU machine's transformers predates the model.
    ``activity``: ``noise`` (random speakers) or ``steady`` (speaker 0 always over the threshold, the rest never)."""
    from safetensors.torch import save_file

    from oasr.models import DIARIZATION_ARCHITECTURES

    family = DIARIZATION_ARCHITECTURES.get("nemotron3_diarization")
    config = family.tiny_config() if arch == "tiny" else family.config_class()
    torch.manual_seed(seed)
    model = family.from_config(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:  # unit gain, as transformers' own random models in tests/
                p.normal_(0.0, p[0].numel() ** -0.5)
            elif "norm" in name and name.endswith("weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02)
        if activity == "steady":
            out = model.classifier.out_proj
            out.weight.mul_(0.25)
            out.bias.fill_(-STEADY_LOGIT)
            out.bias[0] = STEADY_LOGIT
        elif activity != "noise":
            raise ValueError(f"speaker activity {activity!r}: choose one of {', '.join(SPEAKER_ACTIVITY)}")
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config.to_dict()))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(directory / "model.safetensors"))


def noise_clips(seconds: list[float], seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(0.05 * rng.standard_normal(int(s * SAMPLE_RATE), dtype=np.float32)) for s in seconds]


# ------------------------------------------------------------------------------------ live

@dataclass
class Sends:
    """When each stream's audio went out: (samples sent so far, when), ascending."""

    sent: list[tuple[int, float]] = field(default_factory=list)

    def sent_by(self, sample: int) -> float:
        return next(t for n, t in self.sent if n >= sample)


def run_live(asr, diarizer, audio: list[np.ndarray], chunk_ms: int, lookahead: int, mode: str) -> dict:
    """Every clip as one ASR stream and one diarization stream, pushed in real time -> per-chunk latencies."""
    from oasr.streaming.types import StreamOptions

    geometry = asr.runtime.geometry(lookahead)
    hop, half = asr.runtime.hop, asr.runtime.new_audio().half_window
    diar_mode = diarizer.modes[mode]
    frame_s = diarizer.loaded.frame_seconds
    # A diarization chunk reads its look-ahead frames and half a window past them before it runs.
    diar_reach = diar_mode.lookahead * diar_mode.factor * diar_mode.hop + diar_mode.n_fft // 2
    piece = SAMPLE_RATE * chunk_ms // 1000
    period = chunk_ms / 1000
    ids = [f"s{i}" for i in range(len(audio))]
    for s in ids:
        asr.open(StreamOptions(lookahead=lookahead), stream_id=s)
        diarizer.open(mode, stream_id=s)
    sends = {s: Sends() for s in ids}
    sent = dict.fromkeys(ids, 0)
    phase = {s: i / len(ids) * period for i, s in enumerate(ids)}
    asr_ms, diar_ms, asr_closed, diar_closed = [], [], set(), set()
    start = time.perf_counter()
    while asr.has_unfinished() or diarizer.has_unfinished():
        now = time.perf_counter()
        for s, samples in zip(ids, audio, strict=True):
            due = min(int((now - start - phase[s]) / period) * piece, len(samples))
            if due > sent[s]:
                asr.push(s, samples[sent[s] : due])
                diarizer.push(s, samples[sent[s] : due])
                sent[s] = due
                sends[s].sent.append((due, now))
                if due >= len(samples):
                    asr.close(s)
                    diarizer.close(s)
        stepped = asr.step()
        done = time.perf_counter()
        for s, index in stepped.chunks:
            needed = min((geometry.chunk_range(index)[1] - 1) * hop + half, len(audio[int(s[1:])]))
            asr_ms.append(1000 * (done - sends[s].sent_by(needed)))
        asr_closed |= {e.stream_id for e in stepped.events if e.closed}
        events = diarizer.step()
        done = time.perf_counter()
        for event in events:
            if len(event.probs):
                end = round((event.start_s + len(event.probs) * frame_s) * SAMPLE_RATE)
                needed = min(end + diar_reach, len(audio[int(event.stream_id[1:])]))
                diar_ms.append(1000 * (done - sends[event.stream_id].sent_by(needed)))
            if event.closed:
                diar_closed.add(event.stream_id)
        if not stepped.chunks and not events:
            time.sleep(0.001)
    return {"streams": len(ids), "chunk_ms": chunk_ms, "diarization_mode": mode,
            "wall_s": round(time.perf_counter() - start, 3),
            "asr": {"chunks": len(asr_ms), "streams_closed": len(asr_closed), "chunk_latency_ms": _ms(asr_ms)},
            "diarization": {"chunks": len(diar_ms), "streams_closed": len(diar_closed),
                            "chunk_latency_ms": _ms(diar_ms)}}


def _ms(values: list[float]) -> dict:
    return {k: None if v is None else round(v, 2) for k, v in percentiles(values).items() if k != "p90"}


def live(args: argparse.Namespace, asr_dir: Path, diar_dir: Path) -> dict:
    from oasr.diarization.loader import load_diarizer
    from oasr.diarization.streams import DiarizationStreams
    from oasr.engine.streams import StreamingConfig, StreamingEngine
    from oasr.models.loader import from_pretrained
    from oasr.streaming.geometry import lookahead_for

    loaded = from_pretrained(str(asr_dir), device=args.device, dtype=None if args.dtype == "auto" else args.dtype)
    diar = load_diarizer(diar_dir, device=args.device, dtype=None if args.dtype == "auto" else args.dtype)
    frame_seconds = loaded.model.config.encoder_config.subsampling_factor * 160 / SAMPLE_RATE
    lookahead = lookahead_for(args.chunk_ms, frame_seconds)
    mode = args.diarization_mode or diar.config.default_streaming_mode

    def engines(n: int):
        config = StreamingConfig(max_streams=n, max_batch=n, warm_lookaheads=(lookahead,))
        return StreamingEngine(loaded, config), DiarizationStreams(diar, max_streams=n)

    warm = min(args.streams, 4)  # first-use costs out of the timed run
    run_live(*engines(warm), noise_clips([2.0] * warm, seed=99), args.chunk_ms, lookahead, mode)
    return run_live(*engines(args.streams), noise_clips([args.seconds] * args.streams, seed=1), args.chunk_ms,
                    lookahead, mode)


# ------------------------------------------------------------------------------------ offline

async def _offline_pass(client, audio: list[np.ndarray], diarize: bool) -> tuple[float, int, int, int]:
    """Every file at once -> (wall seconds, files transcribed, files diarized, segments). A file longer than the
    model's window is cut as the server cuts an upload (``SpanPlanner`` over the client's window), its pieces
    decoded side by side; the diarizer gets the whole file."""
    from oasr.transcription.spans import SpanPlanner, long_audio_detector
    from oasr.types import DecodeOptions

    planner = SpanPlanner(long_audio_detector(client.capabilities, None), client.window_samples)

    async def one(samples: np.ndarray) -> tuple[bool, int | None]:
        async def piece(part: np.ndarray) -> bool:
            async for output in client.generate(part, DecodeOptions(), partial=False):
                if output.finished:
                    return True
            return False

        async def transcribed() -> bool:
            pieces = [samples[start:end] for start, end in planner(samples)]
            return all(await asyncio.gather(*(piece(p) for p in pieces)))

        if not diarize:
            return await transcribed(), None
        done, segments = await asyncio.gather(transcribed(), client.diarize(samples))
        return done, len(segments)

    start = time.perf_counter()
    results = await asyncio.gather(*(one(a) for a in audio))
    return (time.perf_counter() - start, sum(t for t, _ in results), sum(n is not None for _, n in results),
            sum(n or 0 for _, n in results))


def offline(args: argparse.Namespace, asr_dir: Path, diar_dir: Path) -> dict:
    from oasr.hosting.inproc import start_inproc

    lengths = np.random.default_rng(7).uniform(args.min_seconds, args.max_seconds, args.files).round(2).tolist()
    audio = noise_clips(lengths, seed=2)
    audio_s = sum(lengths)
    client = start_inproc(str(asr_dir), device=args.device, dtype=None if args.dtype == "auto" else args.dtype,
                          max_waiting=2 * args.files + 16, diarization_model=str(diar_dir))
    try:
        warm = noise_clips([min(args.max_seconds, 30.0)] * 2, seed=98)
        asyncio.run(_offline_pass(client, warm, diarize=True))
        alone_s, alone_done, _, _ = asyncio.run(_offline_pass(client, audio, diarize=False))
        with_s, with_done, diarized, segments = asyncio.run(_offline_pass(client, audio, diarize=True))
    finally:
        client.shutdown()
    return {"files": args.files, "audio_s": round(audio_s, 1),
            "seconds_per_file": [args.min_seconds, args.max_seconds],
            "asr_alone": {"wall_s": round(alone_s, 4), "rtfx": round(audio_s / alone_s, 2),
                          "files_transcribed": alone_done},
            "with_diarization": {"wall_s": round(with_s, 4), "rtfx": round(audio_s / with_s, 2),
                                 "files_transcribed": with_done, "files_diarized": diarized, "segments": segments},
            "diarization_cost": round(with_s / alone_s - 1, 4)}


# ------------------------------------------------------------------------------------ the run

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m oasr.bench.diarization_cost", description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", default=ASR_ARCHES[0], choices=ASR_ARCHES, help="the random ASR model's shape")
    p.add_argument("--diarization-arch", default=None, choices=DIARIZATION_ARCHES,
                   help="the random diarization model's shape (default: tiny with --arch tiny, else release)")
    p.add_argument("--streams", type=int, default=256, help="live: ASR streams, and as many diarization streams")
    p.add_argument("--chunk-ms", type=int, default=160, help="live: audio each stream sends per chunk period")
    p.add_argument("--seconds", type=float, default=10.0, help="live: audio per stream")
    p.add_argument("--diarization-mode", default=None, help="live: the diarization latency mode (default: the "
                   "model's; low_latency, very_low_latency or ultra_low_latency)")
    p.add_argument("--files", type=int, default=1000, help="offline: files")
    p.add_argument("--min-seconds", type=float, default=30.0, help="offline: the shortest file")
    p.add_argument("--max-seconds", type=float, default=120.0, help="offline: the longest file")
    p.add_argument("--speaker-activity", default="steady", choices=SPEAKER_ACTIVITY,
                   help="steady: speaker 0 talks throughout; noise: the random classifier's (see above)")
    p.add_argument("--skip-live", action="store_true")
    p.add_argument("--skip-offline", action="store_true")
    p.add_argument("--device", default="auto", type=device_name, help=DEVICE_HELP)
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "float16", "bfloat16"))
    p.add_argument("--json-out", type=Path, default=None)
    args = p.parse_args(argv)
    if args.streams < 1 or args.files < 1 or args.chunk_ms < 1 or args.seconds <= 0:
        p.error("--streams, --files and --chunk-ms must be positive, --seconds above 0")
    if not 0 < args.min_seconds <= args.max_seconds:
        p.error("--min-seconds must be above 0 and at most --max-seconds")
    args.diarization_arch = args.diarization_arch or ("tiny" if args.arch == "tiny" else "release")
    return args


def bench(args: argparse.Namespace) -> dict:
    result: dict = {"bench": "diarization_cost", "arch": args.arch, "diarization_arch": args.diarization_arch,
                    "weights": "random", "speaker_activity": args.speaker_activity, "device": args.device,
                    "dtype": args.dtype}
    with tempfile.TemporaryDirectory(prefix="oasr-diarization-bench-") as tmp:
        asr_dir, diar_dir = Path(tmp) / "asr", Path(tmp) / "diarization"
        print(f"# building random weights in {tmp}", file=sys.stderr, flush=True)
        build_model(args.arch, asr_dir, blank_bias=1.0)  # mostly blanks, as a trained model emits
        build_diarization_model(args.diarization_arch, diar_dir, activity=args.speaker_activity)
        if not args.skip_live:
            result["live"] = live(args, asr_dir, diar_dir)
            print(json.dumps({"live": result["live"]}), file=sys.stderr, flush=True)  # kept if offline fails
        if not args.skip_offline:
            result["offline"] = offline(args, asr_dir, diar_dir)
    live_ok = "live" not in result or all(result["live"][k]["streams_closed"] == args.streams
                                          for k in ("asr", "diarization"))
    off = result.get("offline")
    offline_ok = off is None or (off["asr_alone"]["files_transcribed"] == args.files
                                 and off["with_diarization"]["files_transcribed"] == args.files
                                 and off["with_diarization"]["files_diarized"] == args.files)
    result["clean"] = live_ok and offline_ok
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = bench(args)
    print(json.dumps(result))
    if args.json_out:
        args.json_out.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["clean"] else 1


if __name__ == "__main__":
    sys.exit(main())
