#!/usr/bin/env python3
"""Half precision against float32 on the GPU (TF32 off), many utterances in one engine run.

    PYTHONPATH=. python3 scripts/precision_check.py MANIFEST.jsonl [--model tiny.en] [--repeat 17]

Every clip of the manifest is decoded once in float32, then REPEAT times in float16 mixed into one run (so rows
meet different batch compositions); prints how many float16 transcripts are token-identical to float32.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from oasr.bench.run import BenchItem, engine_config, load_manifest
from oasr.engine.engine import ASREngine
from oasr.models.loader import from_pretrained
from oasr.types import DecodeOptions


def decode(model: str, dtype: str, items: list[BenchItem], repeat: int) -> tuple[dict[str, list[int]], float]:
    engine = ASREngine(from_pretrained(model, device="cuda", dtype=dtype), engine_config(12, 512, True))
    list(engine.run((f"warmup-{i}", it.audio, DecodeOptions()) for i, it in enumerate(items)))
    torch.cuda.synchronize()
    start = time.perf_counter()
    requests = ((f"{it.item_id}@{r}", it.audio, DecodeOptions()) for r in range(repeat) for it in items)
    out = {o.request_id: o.token_ids for o in engine.run(requests)}
    torch.cuda.synchronize()
    return out, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("manifest", type=Path)
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument("--repeat", type=int, default=17)
    parser.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"))
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    items = load_manifest(args.manifest, repeat=1)
    reference, _ = decode(args.model, "float32", items, 1)
    reference = {k.split("@")[0]: v for k, v in reference.items()}
    out, seconds = decode(args.model, args.dtype, items, args.repeat)
    differ = sorted(k for k, v in out.items() if v != reference[k.split("@")[0]])
    print(json.dumps({"dtype": args.dtype, "utterances": len(out), "identical": len(out) - len(differ),
                      "fraction": round(1 - len(differ) / len(out), 4),
                      "differ": sorted({d.split("@")[0] for d in differ}), "seconds": round(seconds, 3)}))


if __name__ == "__main__":
    main()
