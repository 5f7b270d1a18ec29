"""Streaming: N concurrent streams through OASR's streaming engine, in simulated real time and flat out, and
transformers' chunked ``generate`` on the same weights and audio where it has the model.

    oasr bench stream --arch nemotron-streaming-0.6b --chunk-ms 160 --streams 1 64 256 512 --device cuda
    oasr bench stream --arch paraformer-zh-streaming --chunk-ms 600 --streams 1 64 256 --device cuda

Random weights of the published shape (Nemotron's joint biased towards blank, as a trained model mostly emits
blanks; the streaming Paraformer's CIF weighing about 0.3 a frame, a token every 200 ms, as Mandarin speech
fires); seeded noise as audio, its content irrelevant to the timing. Nemotron streams through the cache-aware
runtime, paraformer-zh-streaming (FunASR's online model, a FunASR folder written by ``oasr.bench.funasr_models``)
through the ``paraformer_chunked`` runtime, its chunk FunASR's ``chunk_size [0, 10, 5]`` at 600 ms. Reported per
stream count:

- real time: each stream sends one chunk of audio per chunk period, the streams' phases spread over a period.
  Per-chunk latency is from the moment a chunk's last sample was sent to the end of the step that decoded it
  (Riva's definition), p50 / p99; first-partial latency from a stream's first audio to its first tokens; final
  latency from its last audio to its last event. The most streams held is the largest count whose p99
  stays within ``--p99-budget-ms``.
- flat out: every stream's audio available at once; RTFx = audio seconds / wall seconds.
- transformers (Nemotron only): ``generate`` fed a generator of the same features in the same chunks,
  ``--peer-streams`` rows at once (its caches are batch-global, so a batch's streams move together), RTFx
  likewise. The streaming Paraformer has no peer here: FunASR is not one of OASR's dependencies.
"""

from __future__ import annotations

import argparse
import gc
import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from oasr.bench.parakeet import sync

NEMOTRON_SHAPES = {
    # nemotron-speech-streaming-en-0.6b: 24 x 1024 cache-aware FastConformer, 2 x 640 LSTM, 1,025 outputs.
    "nemotron-streaming-0.6b": dict(
        encoder=dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=8, intermediate_size=4096,
                     conv_kernel_size=9, subsampling_conv_channels=256, num_mel_bins=128, sliding_window=71,
                     default_num_lookahead_tokens=13),
        head=dict(vocab_size=1025, blank_token_id=1024, pad_token_id=1024, decoder_hidden_size=640,
                  num_decoder_layers=2)),
}
BLANK_BIAS = 1.0  # added to the joint's blank logit (--blank-bias): fewer tokens per frame, as a trained model


def build(arch: str, directory: Path, seed: int = 0, blank_bias: float = BLANK_BIAS, shape: dict | None = None):
    """Random weights of ``NEMOTRON_SHAPES[arch]`` (or of ``shape``, laid out as those are) in ``directory``."""
    import transformers

    from oasr.bench.parakeet import _write_vocabulary

    shape = shape or NEMOTRON_SHAPES[arch]
    torch.manual_seed(seed)
    config = transformers.NemotronAsrStreamingConfig(
        encoder_config=transformers.NemotronAsrStreamingEncoderConfig(**shape["encoder"]), **shape["head"],
        decoder_start_token_id=shape["head"]["blank_token_id"])
    model = transformers.NemotronAsrStreamingForRNNT(config).eval()
    with torch.no_grad():
        model.joint.head.bias[config.blank_token_id] += blank_bias
    model.save_pretrained(directory)
    # The feature extractor's published settings, written out rather than through transformers' class, which
    # some releases build with librosa (not needed here: OASR computes the features itself).
    (directory / "preprocessor_config.json").write_text(json.dumps(dict(
        feature_extractor_type="NemotronAsrStreamingFeatureExtractor", feature_size=shape["encoder"]["num_mel_bins"],
        hop_length=160, n_fft=512, win_length=400, preemphasis=0.97, sampling_rate=16000, padding_value=0.0,
        padding_side="right", return_attention_mask=True, mel_filters_dtype="float32")))
    _write_vocabulary(directory / "tokenizer.json", shape["head"]["vocab_size"])
    return model


def noise(count: int, seconds: float, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(0.05 * rng.standard_normal(int(seconds * 16000))).astype(np.float32) for _ in range(count)]


@dataclass
class StreamTimes:
    sent: list[tuple[int, float]] = field(default_factory=list)  # (samples sent so far, when)
    first_audio: float | None = None
    first_tokens: float | None = None
    last_audio: float | None = None
    closed: float | None = None

    def sent_by(self, sample: int) -> float:
        return next(t for n, t in self.sent if n >= sample)


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def run_oasr(engine, audio: list[np.ndarray], lookahead: int, *, realtime: bool) -> dict:
    """All streams through ``engine`` -> latency (ms) and throughput figures."""
    from oasr.engine.streams import StreamOptions

    runtime = engine.runtime
    geometry = runtime.geometry(lookahead)
    hop, half = runtime.hop, runtime.new_audio().half_window
    chunk_s = geometry.chunk_seconds
    chunk_samples = round(chunk_s * 16000)
    # Samples a chunk's last frame reads past its first: half a window for centred STFT frames, the whole frame
    # for LFR frames (whose buffers have no half window).
    reach = half or hop
    ids = [engine.open(StreamOptions(lookahead=lookahead), stream_id=f"s{i}") for i in range(len(audio))]
    times = {s: StreamTimes() for s in ids}
    sent = dict.fromkeys(ids, 0)
    phase = {s: (i / len(ids)) * chunk_s for i, s in enumerate(ids)}
    latencies: list[float] = []
    num_tokens = steps = 0
    sync(runtime.device)
    start = time.perf_counter()
    while engine.has_unfinished():
        now = time.perf_counter()
        for s, samples in zip(ids, audio, strict=True):
            if sent[s] >= len(samples):
                continue
            due = len(samples) if not realtime else int((now - start - phase[s]) / chunk_s) * chunk_samples
            if due > sent[s]:
                engine.push(s, samples[sent[s] : due])
                sent[s] = min(due, len(samples))
                t = times[s]
                t.sent.append((sent[s], now))
                t.first_audio = t.first_audio or now
                if sent[s] >= len(samples):
                    engine.close(s)
                    t.last_audio = now
        result = engine.step()
        steps += 1
        done = time.perf_counter()
        for stream_id, index in result.chunks:
            last_frame = geometry.chunk_range(index)[1] - 1
            needed = min(last_frame * hop + reach, len(audio[int(stream_id[1:])]))
            latencies.append(done - times[stream_id].sent_by(needed))
        for event in result.events:
            t = times[event.stream_id]
            num_tokens += len(event.new_token_ids)
            if event.new_token_ids and t.first_tokens is None:
                t.first_tokens = done
            if event.closed:
                t.closed = done
        if realtime and not result.chunks:
            time.sleep(0.001)
    wall = time.perf_counter() - start
    audio_s = sum(len(a) for a in audio) / 16000
    first = [t.first_tokens - t.first_audio for t in times.values() if t.first_tokens is not None]
    final = [t.closed - t.last_audio for t in times.values()]
    ms = 1000.0
    return dict(streams=len(audio), wall_s=wall, rtfx=audio_s / wall, tokens=num_tokens, steps=steps,
                chunk_p50_ms=percentile(latencies, 50) * ms, chunk_p99_ms=percentile(latencies, 99) * ms,
                first_partial_p50_ms=percentile(first, 50) * ms, first_partial_p99_ms=percentile(first, 99) * ms,
                final_p50_ms=percentile(final, 50) * ms, final_p99_ms=percentile(final, 99) * ms)


def profile_steps(engine, audio: list[np.ndarray], lookahead: int) -> None:
    """``audio`` flat out under torch's profiler, to stderr: the steps' wall time beside the device's kernel time
    (the gap is the host: Python, launches, syncs), then ``profile_oasr``'s tables."""
    import sys
    from contextlib import redirect_stdout

    from oasr.bench.profiling import profile_oasr

    results = []

    def run() -> tuple[float]:
        results.append(run_oasr(engine, audio, lookahead, realtime=False))
        return (results[-1]["wall_s"],)

    with redirect_stdout(sys.stderr):
        print(f"== profile: {len(audio)} streams flat out")
        profile_oasr(run)
        print(f"{results[-1]['steps']} steps")


def run_transformers(model, features: torch.Tensor, lookahead: int, batch_size: int) -> tuple[float, list]:
    """features: [N, T, n_mels] on the device -> (seconds, tokens per row) of streaming ``generate``."""
    from oasr.bench.parakeet import sync as _sync

    first, size = 1 + 8 * lookahead, 8 * (lookahead + 1)
    blank = model.config.blank_token_id
    ids = []
    _sync(features.device)
    start = time.perf_counter()
    for b in range(0, features.shape[0], batch_size):
        x = features[b : b + batch_size]

        def chunks(x=x):
            yield x[:, :first]
            for s in range(first, x.shape[1], size):
                c = x[:, s : s + size]
                yield torch.nn.functional.pad(c, (0, 0, 0, size - c.shape[1]))

        with torch.inference_mode():
            out = model.generate(input_features=chunks(), num_lookahead_tokens=lookahead, max_new_tokens=10**6)
        ids += [[t for t in row.tolist()[1:] if t != blank] for row in out.sequences]
    _sync(features.device)
    return time.perf_counter() - start, ids


def frame_seconds(loaded) -> float:
    """Audio time of one encoder frame (what ``--chunk-ms`` is counted in)."""
    if loaded.architecture == "paraformer_streaming":
        c = loaded.features.config
        return c.hop_length * c.lfr_n / c.sample_rate
    return loaded.model.config.encoder_config.subsampling_factor * 160 / 16000


def main(argv: list[str] | None = None) -> None:
    from oasr.bench.funasr_models import STREAMING_SHAPES, write_funasr_folder
    from oasr.models.loader import from_pretrained, pick_device, pick_dtype
    from oasr.engine.streams import StreamingConfig, StreamingEngine
    from oasr.streaming.geometry import lookahead_for

    p = argparse.ArgumentParser(prog="oasr bench stream", description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", default="nemotron-streaming-0.6b", choices=(*NEMOTRON_SHAPES, *STREAMING_SHAPES))
    p.add_argument("--chunk-ms", type=int, default=160)
    p.add_argument("--streams", type=int, nargs="+", default=[1, 64, 256, 512])
    p.add_argument("--seconds", type=float, default=10.0, help="audio per stream")
    p.add_argument("--p99-budget-ms", type=float, default=100.0)
    p.add_argument("--flat-out", type=int, nargs="*", default=None,
                   help="stream counts run flat out (default: --streams)")
    p.add_argument("--peer", choices=("transformers", "none"), default=None,
                   help="transformers for Nemotron (the default there); none for the streaming Paraformer")
    p.add_argument("--peer-streams", type=int, default=64, help="streams transformers decodes (in one batch)")
    p.add_argument("--blank-bias", type=float, default=BLANK_BIAS)
    p.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=True,
                   help="replay each step shape's forward as a CUDA graph (the engine's default)")
    p.add_argument("--profile", type=int, nargs="*", default=[], metavar="N",
                   help="after the runs, N streams flat out under torch's profiler, each count (to stderr): per step "
                        "wall against device time, kernels by kind, the top kernels and ops")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--json-out", type=Path, default=None)
    args = p.parse_args(argv)
    paraformer = args.arch in STREAMING_SHAPES
    peer = args.peer or ("none" if paraformer else "transformers")
    if paraformer and peer == "transformers":
        p.error(f"--arch {args.arch} has no transformers peer: pass --peer none")
    device = pick_device(args.device)
    dtype = pick_dtype(args.dtype, device)
    report: dict = dict(arch=args.arch, chunk_ms=args.chunk_ms, seconds=args.seconds, device=str(device),
                        dtype=str(dtype), cuda_graphs=args.cuda_graphs, realtime=[], flat_out=[])
    with tempfile.TemporaryDirectory() as tmp:
        if paraformer:
            write_funasr_folder(args.arch, Path(tmp))
        else:
            reference = build(args.arch, Path(tmp), blank_bias=args.blank_bias)
        loaded = from_pretrained(tmp, device=device, dtype=dtype)
    warm_up_streams = 4
    max_streams = max(args.streams + (args.flat_out or []) + ([args.peer_streams] if peer != "none" else [])
                      + [warm_up_streams])
    lookahead = lookahead_for(args.chunk_ms, frame_seconds(loaded))

    def engine() -> StreamingEngine:
        # The last run's engine (its state pool and CUDA graphs, gigabytes at 1,024 streams) is released before the
        # next is built, so that no run is timed beside another's memory or a collection of it.
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        return StreamingEngine(loaded, StreamingConfig(max_streams=max_streams, max_batch=max_streams,
                                                       warm_lookaheads=(lookahead,), cuda_graphs=args.cuda_graphs))

    run_oasr(engine(), noise(warm_up_streams, 2.0, seed=99), lookahead, realtime=False)
    for n in args.streams:
        result = run_oasr(engine(), noise(n, args.seconds, seed=n), lookahead, realtime=True)
        report["realtime"].append(result)
        print(json.dumps({"realtime": result}))
    held = [r["streams"] for r in report["realtime"] if r["chunk_p99_ms"] <= args.p99_budget_ms]
    report["most_streams_within_budget"] = max(held) if held else 0
    for n in args.flat_out if args.flat_out is not None else args.streams:
        result = run_oasr(engine(), noise(n, args.seconds, seed=n), lookahead, realtime=False)
        report["flat_out"].append(result)
        print(json.dumps({"flat_out": result}))
    if peer == "transformers":
        n = args.peer_streams
        audio = noise(n, args.seconds, seed=n)
        ours = run_oasr(engine(), audio, lookahead, realtime=False)
        reference = reference.to(device=device, dtype=dtype)
        features, lengths = loaded.features(audio, device=device)
        x = features.transpose(1, 2)[:, : int(lengths.max())].to(dtype)
        run_transformers(reference, x[:2, :200], lookahead, 2)  # warm-up
        seconds, _ = run_transformers(reference, x, lookahead, n)
        peer = dict(streams=n, wall_s=seconds, rtfx=n * args.seconds / seconds)
        report["peer"] = dict(oasr=ours, transformers=peer, ratio=ours["rtfx"] / peer["rtfx"])
        print(json.dumps({"peer": report["peer"]}))
    for n in args.profile:
        profile_steps(engine(), noise(n, args.seconds, seed=n), lookahead)
    print(json.dumps({"most_streams_within_budget": report["most_streams_within_budget"],
                      "p99_budget_ms": args.p99_budget_ms}))
    if args.json_out:
        args.json_out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
