#!/usr/bin/env bash
# The GPU measurements the open issues still wait for, in one command on a CUDA host, each under its own time limit
# so that one slow bench cannot take the others' time (a lent GPU call ends at 10 minutes: pick with ONLY).
# Usage: scripts/gpu_pending.sh OUT_DIR          (PYTHONPATH must reach oasr and the offline bundle's site dir)
#   OASR_MULTILINGUAL_TOKENIZER  a multilingual Whisper tokenizer.json for the long-speech bench (default: base's)
#   ONLY                         names of the runs below to do, space-separated (default: all)
#   LIMIT_S                      each run's time limit in seconds (default 280)
#   LONGSPEECH_ARGS              more arguments for the long-speech runs (an 80 GB card: --memory-gib 24, so that
#                                transformers' batch of 128 fits beside OASR's cache)
# kenlm (the lm extra) is needed for ctc_lm and has no wheel: build one for the host's Python beforehand
# (`pythonX.Y -m pip wheel kenlm --no-deps`) and install it with the bundle. The funasr_* runs need funasr's wheels
# on PYTHONPATH (oasr/bench/funasr.py lists them); grpc_streams needs grpcio and protobuf (the grpc extra).
set -uo pipefail
out=${1:?usage: scripts/gpu_pending.sh OUT_DIR}
mkdir -p "$out"
limit=${LIMIT_S:-280}
tokenizer=${OASR_MULTILINGUAL_TOKENIZER:+--tokenizer $OASR_MULTILINGUAL_TOKENIZER}
longspeech="$tokenizer ${LONGSPEECH_ARGS:-}"
declare -A RUNS=(
  [longspeech_v3]="python3 -m oasr.bench.longspeech --arch whisper-large-v3 $longspeech --device cuda --dtype float16"
  [longspeech_turbo]="python3 -m oasr.bench.longspeech --arch whisper-large-v3-turbo $longspeech --device cuda --dtype float16"
  [longspeech_v3_fp8kv]="python3 -m oasr.bench.longspeech --arch whisper-large-v3 $longspeech --device cuda --dtype float16 --kv-cache-dtype fp8"
  [longspeech_turbo_fp8kv]="python3 -m oasr.bench.longspeech --arch whisper-large-v3-turbo $longspeech --device cuda --dtype float16 --kv-cache-dtype fp8"
  [ctc_lm]="python3 -m oasr.bench.ctc_lm --arch parakeet-ctc-1.1b --num-utterances 1024 --rounds 1 --pyctcdecode-clips 128 --device cuda"
  [ctc_lm_rows256]="python3 -m oasr.bench.ctc_lm --arch parakeet-ctc-1.1b --num-utterances 1024 --rounds 1 --max-encode-rows 256 --pyctcdecode-clips 16 --device cuda"
  [ctc_lm_eager]="python3 -m oasr.bench.ctc_lm --arch parakeet-ctc-1.1b --num-utterances 1024 --rounds 1 --no-cuda-graphs --pyctcdecode-clips 16 --device cuda"
  [ctc_lm_pruned]="python3 -m oasr.bench.ctc_lm --arch parakeet-ctc-1.1b --num-utterances 1024 --rounds 1 --beam-size-token 16 --beam-threshold 10 --device cuda"
  [diarization]="python3 -m oasr.bench.diarization_cost --device cuda"
  [diarization_profile]="python3 scripts/profile_diarization.py --device cuda --files 200"
  [nemotron_stream]="python3 -m oasr.cli bench stream --arch nemotron-streaming-0.6b --chunk-ms 160 --streams 1 64 512 1024 --flat-out 1024 --seconds 8 --profile 1 --device cuda"
  [nemotron_stream_profile]="python3 -m oasr.cli bench stream --arch nemotron-streaming-0.6b --chunk-ms 160 --streams 1024 --seconds 3 --flat-out 1024 --peer none --profile 1024 --device cuda"
  [paraformer_stream]="python3 -m oasr.cli bench stream --arch paraformer-zh-streaming --chunk-ms 600 --streams 1 64 256 --flat-out 256 --seconds 10 --device cuda"
  [grpc_streams]="python3 -m oasr.bench.grpc_streams --arch nemotron-streaming-0.6b --streams 256 --chunk-ms 160 --seconds 8 --device cuda"
  [funasr_paraformer]="python3 -m oasr.bench.funasr --arch paraformer-large --num-utterances 1024 --max-encode-rows 32 64 128 --device cuda"
  [funasr_sensevoice]="python3 -m oasr.bench.funasr --arch sense-voice-small --num-utterances 1024 --device cuda"
  [realtime_alone]="python3 -m oasr.cli bench realtime --model tiny.en --sessions 64 --synthetic-seconds 8 --device cuda"
  [realtime_nemotron]="python3 -m oasr.cli bench realtime --nemotron-shape --sessions 256 --synthetic-seconds 8 --device cuda"
  [realtime_nemotron_api4]="python3 -m oasr.cli bench realtime --nemotron-shape --sessions 256 --synthetic-seconds 8 --api-workers 4 --device cuda"
  [realtime_nemotron_profile]="python3 -m oasr.cli bench realtime --nemotron-shape --sessions 256 --synthetic-seconds 8 --profile-core $out/core.prof --device cuda"
  [realtime_bulk]="python3 -m oasr.cli bench realtime --model tiny.en --sessions 64 --synthetic-seconds 8 --bulk-uploads 16 --device cuda"
  [voxtral]="python3 -m oasr.bench.voxtral --arch voxtral-mini-3b --num-utterances 1024 --output-tokens 32 --device cuda"
)
ORDER="longspeech_v3 longspeech_turbo longspeech_v3_fp8kv longspeech_turbo_fp8kv ctc_lm ctc_lm_rows256 ctc_lm_eager ctc_lm_pruned diarization diarization_profile nemotron_stream
       nemotron_stream_profile paraformer_stream grpc_streams
       funasr_paraformer funasr_sensevoice realtime_alone realtime_bulk realtime_nemotron realtime_nemotron_api4 realtime_nemotron_profile voxtral"
for name in ${ONLY:-$ORDER}; do
  command=${RUNS[$name]:?unknown run $name; known: $ORDER}
  echo "+ $command"
  start=$(date +%s)
  timeout "$limit" $command >"$out/$name.json" 2>"$out/$name.err"
  echo "== $name: exit $?, $(( $(date +%s) - start )) s"
  tail -c 2000 "$out/$name.json"; echo; tail -3 "$out/$name.err"
done
