"""The ``oasr bench`` command: arguments, the runs, and the printed comparison."""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from oasr.models.catalogue import MODEL_HELP
from oasr.devices import DEVICE_HELP, device_name

if TYPE_CHECKING:
    from oasr.bench.run import BenchItem, BenchResult

# Every command's parser is built on every start (``oasr serve`` too), so the runs' modules, which import torch,
# are imported only when a bench runs.
# Benches with arguments of their own, run as ``oasr bench <kind> ...``: the rest of the line goes to the module's
# ``main``, imported only then.
OWN_ARGUMENTS = {"stream": "oasr.bench.stream", "realtime": "oasr.bench.realtime"}


def run_own(kind: str, argv: list[str]) -> int:
    """``oasr bench <kind> argv...`` for a kind of ``OWN_ARGUMENTS``; its exit status."""
    return importlib.import_module(OWN_ARGUMENTS[kind]).main(argv) or 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="measure throughput, latency and WER (optionally beside transformers); "
                                     "streams: oasr bench stream --help; realtime sessions "
                                     "against a server: oasr bench realtime --help")
    p.add_argument("--model", default="tiny.en", help=MODEL_HELP)
    p.add_argument("--manifest", type=Path, help="JSONL with audio (relative path), text, language")
    p.add_argument("--repeat", type=int, default=1, help="pass over the manifest this many times")
    p.add_argument("--device", default="auto", type=device_name, help=DEVICE_HELP)
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "float16", "bfloat16"))
    p.add_argument("--peer", choices=("transformers",), default=None)
    p.add_argument("--peer-batch-sizes", type=int, nargs="+", default=[16, 64, 256])
    p.add_argument("--max-num-seqs", type=int, default=256, help="requests decoding at once")
    p.add_argument("--memory-gib", type=float, default=8.0, help="KV memory budget (self + cross attention)")
    p.add_argument("--no-cuda-graphs", action="store_true")
    p.add_argument("--compile-encoder", action="store_true", help="torch.compile the encoder (AED, CUDA)")
    p.add_argument("--latency", action="store_true", help="also time single requests alone")
    p.add_argument("--random-weights", action="store_true", help="random weights of --arch's shape on both sides")
    p.add_argument("--arch", default="whisper-large-v3")
    p.add_argument("--tokenizer", type=Path, default=None, help="multilingual tokenizer.json for --random-weights")
    p.add_argument("--fixed-output-tokens", type=int, default=None, help="force exactly N generated tokens")
    p.add_argument("--num-utterances", type=int, default=256, help="synthetic clips when no manifest is given")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--quantization", default=None, choices=("fp8", "int8"),
                   help="quantize the model's GEMMs at load (W8A8; see docs/quantization.md)")
    p.add_argument("--quantize-decode-steps", action="store_true",
                   help="with --random-weights: quantize the decode steps' GEMMs too (as oasr quantize --decode-steps)")
    p.add_argument("--kv-cache-dtype", default="auto", choices=("auto", "fp8"),
                   help="how OASR's decoder caches hold keys and values (fp8: e4m3 with a scale per position and head)")
    p.add_argument("--timed-runs", type=int, default=1, metavar="N",
                   help="time each system N times after its warm-up and report its fastest run (transformers' time "
                        "on a GPU can vary by a quarter or more between runs)")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="after the timed run, profile one more of OASR's and print its top N kernels and ops")


def _synthetic(count: int, seconds: float = 4.0) -> list[BenchItem]:
    from oasr.bench.run import BenchItem

    rng = np.random.default_rng(0)
    return [BenchItem(f"noise-{i}", (0.05 * rng.standard_normal(int(seconds * 16000))).astype(np.float32), None, "en")
            for i in range(count)]


def _wer(items: list[BenchItem], tokens: dict[str, list[int]], tokenizer) -> float | None:
    labelled = [it for it in items if it.text]
    if not labelled:
        return None
    from oasr.bench.wer import word_error_rate

    language = "en" if all(it.language in (None, "en") for it in labelled) else None
    hypotheses = [tokenizer.decode(tokens[it.item_id]) for it in labelled]
    return word_error_rate([it.text for it in labelled], hypotheses, language=language or "multi").wer


def _quantize_random(loaded, method_name: str, decode_steps: bool) -> None:
    """Random weights have no activations worth calibrating on: their GEMMs are quantized where they lie, without
    smoothing (which changes the numbers, not the work)."""
    from oasr.quantization.apply import check_serves, method_named, quantize_weights, quantized_modules

    check_serves(method_name, loaded.device, loaded.dtype)
    modules = quantized_modules(loaded.model, decode_steps=decode_steps)
    quantize_weights(loaded.model, method_named(method_name), modules)


def run(args: argparse.Namespace) -> int:
    if args.timed_runs < 1:
        print(f"oasr: error: bench: --timed-runs must be at least 1, got {args.timed_runs}", file=sys.stderr)
        return 2
    if args.quantize_decode_steps and not (args.random_weights and args.quantization):
        print("oasr: error: bench: --quantize-decode-steps needs --random-weights and --quantization (a checkpoint's "
              "own choice comes from `oasr quantize --decode-steps`)", file=sys.stderr)
        return 2
    from oasr.bench.run import (
        as_json,
        bench_oasr,
        bench_transformers,
        engine_config,
        load_manifest,
        single_request_latency,
    )
    from oasr.api import from_pretrained
    from oasr.models.loader import pick_device, pick_dtype

    device = pick_device(args.device)
    dtype = pick_dtype(None if args.dtype == "auto" else args.dtype, device)
    if args.random_weights:
        from oasr.bench.random_model import random_whisper

        loaded, state = random_whisper(args.arch, device=device, dtype=dtype, tokenizer_file=args.tokenizer)
        if args.quantization:
            _quantize_random(loaded, args.quantization, args.quantize_decode_steps)
    else:
        loaded = from_pretrained(args.model, device=device, dtype=dtype, keep_checkpoint=args.peer is not None,
                                 quantization=args.quantization)
        state = loaded.checkpoint.state_dict if loaded.checkpoint else None
    items = load_manifest(args.manifest, repeat=args.repeat) if args.manifest else _synthetic(args.num_utterances)
    config = engine_config(args.memory_gib, args.max_num_seqs, not args.no_cuda_graphs, args.compile_encoder,
                           args.kv_cache_dtype)
    results: list[BenchResult] = []
    ours, our_tokens = bench_oasr(loaded, items, config, fixed_output_tokens=args.fixed_output_tokens,
                                  profile=args.profile, timed_runs=args.timed_runs)
    if not args.fixed_output_tokens:
        ours.wer = _wer(items, our_tokens, loaded.tokenizer)
    results.append(ours)
    extra: dict = {"model": loaded.name, "device": str(device), "dtype": str(dtype).removeprefix("torch.")}
    if args.quantization:
        extra["dtype"] += f", {args.quantization} GEMMs"
    if args.peer == "transformers":
        theirs, their_tokens = bench_transformers(loaded, state, items, fixed_output_tokens=args.fixed_output_tokens,
                                                  batch_sizes=args.peer_batch_sizes, timed_runs=args.timed_runs)
        if not args.fixed_output_tokens:
            theirs.wer = _wer(items, their_tokens, loaded.tokenizer)
        results.append(theirs)
        extra["rtfx_ratio"] = ours.rtfx / theirs.rtfx
        extra["identical_transcripts"] = float(np.mean([our_tokens[k] == their_tokens[k] for k in our_tokens]))
    if args.latency:
        extra["single_request_seconds"] = single_request_latency(loaded, state if args.peer else None, items, config)
    if args.json:
        print(as_json(results, extra))
    else:
        _print_table(results, extra)
    return 0


def _print_table(results: list[BenchResult], extra: dict) -> None:
    out = sys.stdout
    out.write(f"model: {extra['model']} on {extra['device']} ({extra['dtype']})\n")
    header = f"{'system':14s} {'utts':>6s} {'audio s':>9s} {'wall s':>8s} {'RTFx':>8s} {'utt/s':>8s} {'WER':>7s} " \
             f"{'p50 s':>7s} {'p99 s':>7s} {'GiB':>6s} {'batch':>6s}\n"
    out.write(header)
    for r in results:
        def fmt(v, spec):
            return format(v, spec) if v is not None else "-".rjust(len(format(0.0, spec)))
        out.write(f"{r.system:14s} {r.num_utterances:6d} {r.audio_seconds:9.1f} {r.wall_seconds:8.2f} {r.rtfx:8.1f} "
                  f"{r.utterances_per_second:8.1f} {fmt(r.wer, '7.4f')} {fmt(r.latency_p50, '7.3f')} "
                  f"{fmt(r.latency_p99, '7.3f')} {fmt(r.peak_gpu_memory_gib, '6.2f')} {r.batch_size or 0:6d}\n")
        if r.phases:
            out.write("  phases: " + ", ".join(f"{k} {v:.2f}s" for k, v in r.phases.items()) + "\n")
    for key in ("rtfx_ratio", "identical_transcripts", "single_request_seconds"):
        if key in extra:
            out.write(f"{key}: {extra[key]}\n")
