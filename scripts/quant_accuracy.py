"""WER and token agreement of quantized Whisper against the same checkpoint at full precision.

    python scripts/quant_accuracy.py --model tiny.en --manifest speech/manifest.jsonl --device cuda

Each method (``--methods``, default fp8 and int8) loads the checkpoint quantized at load (``--quantization``);
``kv-fp8`` instead keeps the GEMMs in full precision and the decoder's K/V cache in e4m3 (``--kv-cache-dtype
fp8``). Every run decodes the manifest's English entries greedily through the engine. Printed per run: corpus WER
(Whisper's English normalizer), the share of utterances whose tokens equal the full-precision run's, the token
error rate between the two (edit distance over token ids, per full-precision token), and the WER difference
against full precision with its 95 % paired bootstrap interval over the utterances (``wer_difference``: how much
of a gap this set of clips can resolve).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import replace
from pathlib import Path

import torch

from oasr.bench.run import bench_oasr, engine_config, load_manifest
from oasr.bench.wer import paired_wer_difference, word_error_rate
from oasr.models.loader import from_pretrained, pick_device, pick_dtype


def token_error_rate(reference: dict[str, list[int]], hypothesis: dict[str, list[int]]) -> float:
    """Edit distance over token ids, summed over utterances, per reference token (jiwer over id 'words')."""
    import jiwer

    ids = sorted(reference)
    as_words = lambda tokens: " ".join(f"t{t}" for t in tokens) or "t-"  # noqa: E731 (jiwer refuses empty text)
    return jiwer.wer([as_words(reference[i]) for i in ids], [as_words(hypothesis[i]) for i in ids])


def english_manifest(path: Path, out: Path) -> Path:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    english = [{**row, "audio": str((path.parent / row["audio"]).resolve())} for row in rows
               if row.get("language") == "en" and row.get("text")]
    out.write_text("".join(json.dumps(row) + "\n" for row in english))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument("--manifest", type=Path, required=True)
    parser.add_argument("--methods", nargs="*", default=["fp8", "int8"], choices=["fp8", "int8", "kv-fp8"])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--only", default=None, metavar="PREFIX",
                        help="quantize only the layers whose path starts with PREFIX (e.g. model.encoder), to see "
                        "which part of the model costs the accuracy")
    args = parser.parse_args()
    device = pick_device(args.device)
    dtype = pick_dtype(args.dtype, device)
    with tempfile.TemporaryDirectory() as tmp:
        items = load_manifest(english_manifest(args.manifest, Path(tmp) / "en.jsonl"))
    config = engine_config(4.0, args.max_num_seqs, device.type == "cuda")
    references = [it.text for it in items]
    runs: dict[str, dict[str, list[int]]] = {}
    texts_of: dict[str, list[str]] = {}
    report = {"model": args.model, "device": str(device), "dtype": str(dtype).removeprefix("torch."),
              "utterances": len(items), "only": args.only, "runs": {}}
    for method in [None, *args.methods]:
        cache = "fp8" if method == "kv-fp8" else "auto"
        gemms = None if args.only or cache == "fp8" else method
        loaded = from_pretrained(args.model, device=device, dtype=dtype, quantization=gemms)
        if args.only and method is not None and cache == "auto":  # a part of the model, unsmoothed
            from oasr.quantization.apply import method_named, quantizable, quantize_weights

            chosen = tuple(name for name in quantizable(loaded.model) if name.startswith(args.only))
            quantize_weights(loaded.model, method_named(method), chosen)
        _, tokens = bench_oasr(loaded, items, replace(config, cache=replace(config.cache, kv_cache_dtype=cache)))
        name = method or "full"
        runs[name] = tokens
        texts = texts_of[name] = [loaded.tokenizer.decode(tokens[it.item_id]) for it in items]
        entry = {"wer": word_error_rate(references, texts, language="en").wer}
        if method is not None:
            full = runs["full"]
            entry["identical_utterances"] = sum(full[k] == tokens[k] for k in full) / len(full)
            entry["token_error_rate_vs_full"] = token_error_rate(full, tokens)
            gap = paired_wer_difference(references, texts_of["full"], texts, language="en")
            entry["wer_difference"] = {"value": gap.difference, "low": gap.low, "high": gap.high,
                                       "confidence": gap.confidence}
        report["runs"][name] = entry
        print(name, json.dumps(entry), flush=True)
        del loaded
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
