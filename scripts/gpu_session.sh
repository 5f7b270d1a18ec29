#!/usr/bin/env bash
# One GPU session on an air-gapped host: install the offline bundle, run the GPU tests and the benchmarks.
# Usage: scripts/gpu_session.sh SITE_DIR OUT_DIR BUNDLE_PART_DIR...   (speech data in $OASR_SPEECH_DATA)
set -uo pipefail
site=$1 out=$2; shift 2
python3 scripts/offline_bundle.py install "$@" --target "$site" || exit 1
export PYTHONPATH=$PWD:$site PYTHONUNBUFFERED=1
manifest=$OASR_SPEECH_DATA/manifest.jsonl
run() { echo "+ $*"; "$@"; }
run python3 -m pytest -q -s -p no:cacheprovider --continue-on-collection-errors -m gpu tests/ 2>&1 | grep -v '^\[transformers\]' | tee "$out/gpu_tests.log"
run python3 -m oasr.cli bench --model tiny.en --manifest "$manifest" --repeat 17 --device cuda --peer transformers \
  --latency --json 2>"$out/bench_tiny_en.err" | tee "$out/bench_tiny_en.json"; tail -5 "$out/bench_tiny_en.err"
run python3 -m oasr.cli bench --random-weights --arch whisper-large-v3 --fixed-output-tokens 32 --num-utterances 256 \
  --max-num-seqs 64 --peer transformers --peer-batch-sizes 64 --memory-gib 24 --device cuda --json \
  ${OASR_MULTILINGUAL_TOKENIZER:+--tokenizer "$OASR_MULTILINGUAL_TOKENIZER"} 2>"$out/bench_large_v3.err" | tee "$out/bench_large_v3.json"
tail -5 "$out/bench_large_v3.err"
run python3 -m oasr.bench.serve_load --model tiny.en --manifest "$manifest" --concurrency 1 8 32 64 \
  --engine-mode process thread 2>&1 | tee "$out/serve_load.log"
