#!/usr/bin/env python3
"""Greedy decoding against beam search on labelled speech, in one run: WER and wall time of each.

    PYTHONPATH=. python3 scripts/beam_wer.py [MANIFEST] [--model tiny.en] [--device cpu|cuda] [--beam-size 5]

MANIFEST defaults to the shared speech set ($OASR_SPEECH_DATA, else ../shared/data/speech next to the repo); its
entries of ``--language`` that fit one 30 s window are used. The model is loaded once; each mode decodes every
clip through its own engine with ``--batch-size`` windows in flight (a beam window takes ``beam_size`` rows).
On a GPU a warm-up pass of each mode runs first, untimed. Prints one line per mode and a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from oasr.bench.run import BenchItem, load_manifest
from oasr.bench.wer import word_error_rate
from oasr.engine.config import CacheConfig, EngineConfig
from oasr.engine.engine import ASREngine
from oasr.transcription.offline import engine_config_for
from oasr.models.loader import LoadedModel, from_pretrained
from oasr.types import DecodeOptions, TranscribeOptions


def default_manifest() -> Path:
    root = os.environ.get("OASR_SPEECH_DATA")
    base = Path(root) if root else Path(__file__).resolve().parents[2] / "shared/data/speech"
    return base / "manifest.jsonl"


def decode(loaded: LoadedModel, items: list[BenchItem], options: DecodeOptions, batch_size: int,
           memory_gib: float, warm_up: bool) -> tuple[dict[str, list[int]], float]:
    """Every item through one engine -> (token ids by item id, wall seconds of the timed pass)."""
    config = engine_config_for(TranscribeOptions(batch_size=batch_size, beam_size=options.beam_size),
                               EngineConfig(cache=CacheConfig(memory_budget_bytes=int(memory_gib * 2**30))))
    engine = ASREngine(loaded, config)
    if warm_up:
        list(engine.run((f"warm-up/{it.item_id}", it.audio, options) for it in items))
    synchronize(loaded.device)
    start = time.perf_counter()
    outputs = {o.request_id: o.token_ids for o in engine.run((it.item_id, it.audio, options) for it in items)}
    synchronize(loaded.device)
    return outputs, time.perf_counter() - start


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("manifest", type=Path, nargs="?", default=None)
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--dtype", default=None, help="default: float32 on CPU, float16 on CUDA")
    parser.add_argument("--language", default="en")
    parser.add_argument("--beam-size", type=int, default=5)
    parser.add_argument("--patience", type=float, default=None)
    parser.add_argument("--length-penalty", type=float, default=None)
    parser.add_argument("--batch-size", type=int, default=16, help="windows decoding at once")
    parser.add_argument("--memory-gib", type=float, default=4.0, help="KV cache budget of each engine")
    args = parser.parse_args()

    manifest = args.manifest or default_manifest()
    items = [it for it in load_manifest(manifest) if it.language == args.language and it.text]
    if not items:
        raise SystemExit(f"no {args.language} entries with text that fit one window in {manifest}")
    loaded = from_pretrained(args.model, device=args.device, dtype=args.dtype)
    language = args.language if loaded.config.is_multilingual else None
    modes = {
        "greedy": DecodeOptions(language=language),
        f"beam {args.beam_size}": DecodeOptions(language=language, beam_size=args.beam_size,
                                                patience=args.patience, length_penalty=args.length_penalty),
    }
    audio_seconds = sum(len(it.audio) for it in items) / 16_000
    references = [it.text for it in items]
    summary, tokens = {}, {}
    for name, options in modes.items():
        out, seconds = decode(loaded, items, options, args.batch_size, args.memory_gib, args.device == "cuda")
        tokens[name] = out
        hypotheses = [loaded.tokenizer.decode(out[it.item_id]) for it in items]
        report = word_error_rate(references, hypotheses, args.language)
        summary[name] = {"wer": round(report.wer, 4), "substitutions": report.substitutions,
                         "deletions": report.deletions, "insertions": report.insertions,
                         "seconds": round(seconds, 2), "rtfx": round(audio_seconds / seconds, 1)}
        print(f"{name:>8}: WER {report.wer:.2%} ({report.substitutions} sub, {report.deletions} del, "
              f"{report.insertions} ins of {report.num_reference_words} words), {seconds:.1f} s "
              f"(RTFx {audio_seconds / seconds:.1f})", flush=True)
    greedy, beam = tokens.values()
    changed = sorted(k for k in greedy if greedy[k] != beam[k])
    print(json.dumps({"model": args.model, "device": args.device, "dtype": str(loaded.dtype).removeprefix("torch."),
                      "manifest": str(manifest), "utterances": len(items), "audio_seconds": round(audio_seconds, 1),
                      "batch_size": args.batch_size, "modes": summary, "beam_differs_from_greedy": len(changed)}))


if __name__ == "__main__":
    main()
