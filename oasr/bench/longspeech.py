"""Long speech, decode-heavy (issue 41): hours of podcasts, meetings and calls, where every 30 s window is full of
speech and decodes some 100-150 tokens, through OASR's long-form path and through transformers' own.

The workload: ``--recordings`` recordings of ``--minutes`` minutes each, seeded noise (random weights make the
content irrelevant), cut into full 30 s windows. Each window decodes exactly K tokens, K drawn per window (seeded)
from the token counts of real transcripts: the shared clips' texts tokenized and scaled to 30 s of speech
(``TOKENS_PER_30S``, derived by ``token_counts_from_manifest``; ``--counts-manifest`` derives them again at run
time). The weights are random at the published shape (``oasr.bench.random_model``), the same on both sides.

OASR runs what ``oasr.transcribe`` runs over each whole recording: ``OfflineTranscriber`` with the default
parallel long-form mode, one transcriber (one engine) for every recording at once. ``TranscribeOptions`` has no
token-count fields, so the bench wraps the transcriber's engine (``ForcedLengths``) and sets
``min_new_tokens = max_new_tokens = K`` on each window's request, in the order the transcriber sends them. Two
things are switched off so that each window is decoded once, as on the peer: timestamps (a long input decodes
them by default, and a window ending before its last timestamp pair would be continued by a follow-up request),
and with them the fallback retries (random weights are improbable text at every temperature). What stays is the
long-form path's own work: decoding and cutting the audio, the window covers, the engine's batches across
recordings, the assembly of each recording's result. What users' long inputs pay beyond it: the timestamp rules'
logit filter at every step, and the follow-ups and retries real speech needs now and then.

The peer is transformers' long-form path at its best batch: ``pipeline("automatic-speech-recognition",
chunk_length_s=30, stride_length_s=0, batch_size=B)``, each B of ``--peer-batch-sizes`` timed. Stride 0, not the
pipeline's default (5 s on each side, which would decode 1.5x the windows and merge their overlaps), so both
sides decode the same windows and the same tokens. Whisper's ``generate`` takes one length for a whole batch, so
a logits processor (``WindowLengths``) suppresses end-of-text until each row's K and then forces it; rows that end
early stay in the batch until the longest ends, as rows of real speech do in transformers' generate. Its features
come from the pipeline's own CPU feature extractor, as a pipeline user's do.

The encoder: unless ``--no-encoder-probe``, OASR runs the workload again with one token per window; that time
(features, encoder, prompt and a single decode step) bounds OASR's encoder time from above, so the achieved
TFLOP/s it gives (``encoder_flops`` per 1500-frame window) is a lower bound, set against the H100/H200's
dense fp16 rate of 790 TFLOP/s that issue 41 asks about.

On the H200 (torch 2.11, transformers 5.17), TOKENIZER a multilingual Whisper ``tokenizer.json`` (large-v3's):

    python -m oasr.bench.longspeech --arch whisper-large-v3 --tokenizer TOKENIZER --device cuda --dtype float16
    python -m oasr.bench.longspeech --arch whisper-large-v3-turbo --tokenizer TOKENIZER --device cuda \
        --dtype float16

The defaults: 6 recordings of 10 minutes (60 minutes, 120 windows, about 13,500 tokens), OASR at batch_size 128,
transformers at batches 64 and 128, each side warmed once then timed twice, the best counting: about 3 minutes
for large-v3 on an H100 and under 2 for turbo, most of it building the random models on the CPU and transformers'
runs (``--peer none``: under a minute). ``--kv-cache-dtype fp8`` holds OASR's K/V, the cross-attention's included,
in e4m3 (decode reads half the bytes). ``--compile-encoder`` times OASR's encoder compiled (not what
``oasr.transcribe`` does by default). ``--profile`` then runs OASR's side under torch's profiler, the workload and
its one-token version, tables to stderr. On an 80 GB card give OASR less than the engine's default 40 % of free
memory (``--memory-gib 24``) so that transformers' batch of 128 (its cross-attention caches alone 31 GB at
large-v3) still fits.

The JSON goes to stdout, each timed run to stderr as it comes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from oasr.audio import SAMPLE_RATE
from oasr.types import DecodeOptions

WINDOW_SECONDS = 30
WINDOW_SAMPLES = WINDOW_SECONDS * SAMPLE_RATE
ENCODER_FRAMES = WINDOW_SAMPLES // 160 // 2  # 10 ms mel hop, then the stride-2 convolution: 1500
FP16_DENSE_TFLOPS = 790.0  # H100/H200 SXM, dense fp16/bf16 tensor cores
ARCHES = {"whisper-large-v3": "whisper-large-v3", "whisper-large-v3-turbo": "whisper-large-v3-turbo",
          "tiny": "whisper-tiny"}
SHARED_MANIFEST = Path("/work/shared/data/speech/manifest.jsonl")

# Tokens per 30 s of speech of the shared clips (/work/shared/data/speech/manifest.jsonl): each clip's
# transcript with the multilingual tokenizer (a leading space, as Whisper writes), scaled by 30 s / its duration,
# kept where the clip is at least 5 s long (shorter clips are mostly their silent edges) and the rate is at least
# 80 (below that the clips are digits and commands read with pauses, not running speech), capped at 224 (Whisper's
# default sample length). ``token_counts_from_manifest`` computes them: 34 clips, median 105, mean 112. The
# transcripts are mostly lowercase without punctuation, so Whisper's cased, punctuated text of the same speech runs
# somewhat longer: these counts err on the light side of decode-heavy.
TOKENS_PER_30S = (
    127, 102, 104, 132, 89, 91, 103, 91, 91, 90, 139, 129, 125, 154, 104, 104, 111, 113, 102, 129, 109, 102, 128,
    126, 106, 118, 180, 95, 123, 83, 103, 94, 97, 121,
)
MIN_CLIP_SECONDS = 5.0
MIN_TOKENS_PER_30S = 80
MAX_TOKENS_PER_WINDOW = 224


def token_counts_from_manifest(path: Path, tokenizer) -> tuple[int, ...]:
    """``TOKENS_PER_30S`` from a manifest of labelled clips ({"text", "duration_s"} per line, as the shared
    clips'); ``tokenizer`` encodes text to ids."""
    counts = []
    for line in path.read_text().splitlines():
        row = json.loads(line) if line.strip() else {}
        if not row.get("text") or row.get("duration_s", 0) < MIN_CLIP_SECONDS:
            continue
        rate = round(len(tokenizer.encode(" " + row["text"].strip())) * WINDOW_SECONDS / row["duration_s"])
        if rate >= MIN_TOKENS_PER_30S:
            counts.append(min(rate, MAX_TOKENS_PER_WINDOW))
    return tuple(counts)


@dataclass(frozen=True)
class Workload:
    """``recordings[i]`` is cut into ``len(lengths[i])`` full windows; window j of it decodes ``lengths[i][j]``
    tokens."""

    recordings: tuple[np.ndarray, ...]
    lengths: tuple[tuple[int, ...], ...]

    @property
    def audio_seconds(self) -> float:
        return sum(len(r) for r in self.recordings) / SAMPLE_RATE

    @property
    def window_lengths(self) -> list[int]:
        """Every window's token count, recording by recording: the order both sides decode them in."""
        return [k for per_recording in self.lengths for k in per_recording]

    def with_lengths(self, k: int) -> Workload:
        return replace(self, lengths=tuple(tuple(k for _ in ls) for ls in self.lengths))


def build_workload(num_recordings: int, minutes: float, counts: Sequence[int], seed: int = 0) -> Workload:
    """Seeded noise, each recording a whole number of 30 s windows, and K per window drawn from ``counts``."""
    num_windows = round(minutes * 60 / WINDOW_SECONDS)
    rng = np.random.default_rng(seed)
    recordings = tuple((0.05 * rng.standard_normal(num_windows * WINDOW_SAMPLES)).astype(np.float32)
                       for _ in range(num_recordings))
    lengths = tuple(tuple(int(k) for k in rng.choice(counts, num_windows)) for _ in range(num_recordings))
    return Workload(recordings, lengths)


def encoder_flops(config) -> float:
    """Multiply-adds x 2 of one 1500-frame window through Whisper's encoder: the two stem convolutions (kernel 3),
    then per layer the q/k/v/out projections, the attention scores and their weighted sum, and the MLP."""
    d, t = config.d_model, ENCODER_FRAMES
    stem = 2 * (2 * t * config.num_mel_bins * 3 * d + t * d * 3 * d)
    layer = 2 * (4 * t * d * d + 2 * t * t * d + 2 * t * d * config.encoder_ffn_dim)
    return float(stem + config.encoder_layers * layer)


class ForcedLengths:
    """The transcriber's engine, with each window's request decoding exactly its K tokens: the n-th request the
    transcriber feeds ``run`` is the n-th window of its inputs, in order. Everything else is the engine's.
    ``decoded`` holds each finished request's token count by request id, ``order`` the ids as they were sent."""

    def __init__(self, engine, lengths: Sequence[int]) -> None:
        self.engine = engine
        self.lengths = list(lengths)
        self.order: list[str] = []
        self.decoded: dict[str, int] = {}

    def __getattr__(self, name: str):
        return getattr(self.engine, name)

    def add_request(self, audio, options=None, request_id=None, **kwargs):
        # A follow-up (a continuation or a fallback retry) would decode more than the peer does.
        raise RuntimeError(f"long-form follow-up request {request_id}: the bench decodes each window once")

    def run(self, items: Iterable[tuple[str, np.ndarray, DecodeOptions]]):
        def forced() -> Iterator[tuple[str, np.ndarray, DecodeOptions]]:
            for (request_id, audio, options), k in zip(items, self.lengths, strict=True):
                self.order.append(request_id)
                yield request_id, audio, replace(options, min_new_tokens=k, max_new_tokens=k)

        for output in self.engine.run(forced()):
            self.decoded[output.request_id] = len(output.token_ids)
            yield output


class OasrLongForm:
    """OASR's side: one ``OfflineTranscriber`` over every recording, timed between device synchronisations."""

    def __init__(self, loaded, batch_size: int, config) -> None:
        from oasr.transcription.offline import OfflineTranscriber
        from oasr.types import TranscribeOptions

        self.transcriber = OfflineTranscriber(loaded, TranscribeOptions(language="en", batch_size=batch_size),
                                              config)
        self.transcriber.long_form_timestamps = False  # one decode per window, no follow-ups (module docstring)
        self.engine = self.transcriber.engine
        self.device = loaded.device

    def run(self, workload: Workload) -> tuple[float, list[int]]:
        """-> (seconds, tokens decoded per window in the workload's order)."""
        forced = ForcedLengths(self.engine, workload.window_lengths)
        self.transcriber.engine = forced
        try:
            _sync(self.device)
            start = time.perf_counter()
            results = list(self.transcriber.run(list(workload.recordings)))
            _sync(self.device)
            seconds = time.perf_counter() - start
        finally:
            self.transcriber.engine = self.engine
        failed = [r.error for r in results if r.error]
        if failed:
            raise RuntimeError(f"OASR failed a recording: {failed[0]}")
        return seconds, [forced.decoded[request_id] for request_id in forced.order]


class WindowLengths:
    """A logits processor (transformers' ``LogitsProcessor`` call) for one ``generate`` call: row i may not end
    before ``lengths[i]`` tokens and must end then. scores: [rows, vocab]; the first call sees the prompt."""

    def __init__(self, lengths: Sequence[int], eot: int, device: torch.device) -> None:
        self.lengths = torch.tensor(lengths, device=device)
        self.eot = eot
        self.prompt_length: int | None = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.prompt_length is None:
            self.prompt_length = input_ids.shape[1]
        done = (self.lengths <= input_ids.shape[1] - self.prompt_length)[:, None]
        only_eot = torch.full_like(scores, float("-inf"))
        only_eot[:, self.eot] = 0.0
        scores = scores.clone()
        scores[:, self.eot] = float("-inf")
        return torch.where(done, only_eot, scores)


class PeerLongForm:
    """transformers' side: its ASR pipeline over the same model weights, chunked into 30 s windows (stride 0).
    Each ``generate`` the pipeline calls is handed the next rows' lengths, and its output counted."""

    def __init__(self, loaded, state: dict, tokenizer_file: Path) -> None:
        from transformers import WhisperFeatureExtractor, WhisperTokenizer, pipeline

        from oasr.bench.peer_transformers import hf_whisper_from, loaded_prompt

        self.model = hf_whisper_from(loaded, state).to(device=loaded.device, dtype=loaded.dtype)
        self.eot = loaded.tokenizer.special.eot
        self.prompt = loaded_prompt(loaded)
        self.device = loaded.device
        self.pipe = pipeline("automatic-speech-recognition", model=self.model,
                             # Batching pads with the tokenizer's pad token, which Whisper's tokenizer.json leaves out.
                             tokenizer=WhisperTokenizer(tokenizer_file=str(tokenizer_file), pad_token="<|endoftext|>"),
                             feature_extractor=WhisperFeatureExtractor(feature_size=loaded.config.num_mel_bins),
                             device=loaded.device, dtype=loaded.dtype)
        self._generate = self.model.generate
        self._pending: list[int] = []
        self._counts: list[int] = []
        # The pipeline calls ``self.model.generate``; the instance attribute puts the lengths in between.
        self.model.generate = self._forced_generate

    def _forced_generate(self, *args, **kwargs):
        from transformers import LogitsProcessorList

        rows = kwargs["input_features"].shape[0]
        lengths, self._pending = self._pending[:rows], self._pending[rows:]
        if len(lengths) < rows:
            raise RuntimeError("transformers' pipeline cut more windows than the workload has")
        kwargs["logits_processor"] = LogitsProcessorList([WindowLengths(lengths, self.eot, self.device)])
        out = self._generate(*args, **kwargs)
        sequences = out["sequences"] if isinstance(out, dict) else out
        self._counts += [_tokens_before(row, self.prompt, self.eot) for row in sequences.tolist()]
        return out

    def run(self, workload: Workload, batch_size: int) -> tuple[float, list[int]]:
        """-> (seconds, tokens decoded per window in the workload's order)."""
        self._pending, self._counts = workload.window_lengths, []
        generate_kwargs = {"language": "en", "task": "transcribe", "do_sample": False, "num_beams": 1}
        _sync(self.device)
        start = time.perf_counter()
        with torch.inference_mode():
            self.pipe(list(workload.recordings), chunk_length_s=WINDOW_SECONDS, stride_length_s=0,
                      batch_size=batch_size, generate_kwargs=generate_kwargs)
        _sync(self.device)
        seconds = time.perf_counter() - start
        if self._pending:
            raise RuntimeError(f"transformers' pipeline left {len(self._pending)} windows undecoded")
        return seconds, self._counts


def _tokens_before(row: list[int], prompt: list[int], eot: int) -> int:
    """Generated tokens of one output row of Whisper's generate, up to end-of-text. transformers 5.25 strips the
    prompt from the row; where a version keeps it, it is dropped here."""
    if row[: len(prompt)] == prompt:
        row = row[len(prompt) :]
    return row.index(eot) if eot in row else len(row)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class Timed:
    """Every timed run of one side (seconds) and the token counts of its last, per window."""

    seconds: tuple[float, ...]
    counts: list[int]

    @property
    def best(self) -> float:
        return min(self.seconds)


def run_rounds(ours: OasrLongForm, peer: PeerLongForm | None, workload: Workload, batch_sizes: Sequence[int],
               rounds: int) -> tuple[Timed, dict[int, Timed]]:
    """One untimed pass of each side (each peer batch size), then ``rounds`` alternating timed passes."""
    ours.run(workload)
    for batch_size in batch_sizes if peer else ():
        peer.run(workload, batch_size)
    our_times: list[float] = []
    peer_times: dict[int, list[float]] = {b: [] for b in batch_sizes} if peer else {}
    our_counts: list[int] = []
    peer_counts: dict[int, list[int]] = {}
    for _ in range(rounds):
        seconds, our_counts = ours.run(workload)
        our_times.append(seconds)
        print(f"oasr: {seconds:.3f} s", file=sys.stderr, flush=True)
        for batch_size in peer_times:
            seconds, peer_counts[batch_size] = peer.run(workload, batch_size)
            peer_times[batch_size].append(seconds)
            print(f"transformers at batch {batch_size}: {seconds:.3f} s", file=sys.stderr, flush=True)
    return Timed(tuple(our_times), our_counts), {b: Timed(tuple(t), peer_counts[b]) for b, t in peer_times.items()}


def _side(timed: Timed, audio_seconds: float) -> dict:
    return {"seconds": round(timed.best, 3), "rtfx": round(audio_seconds / timed.best, 1),
            "rounds": [round(t, 3) for t in timed.seconds], "tokens_decoded": sum(timed.counts)}


def report(header: dict, workload: Workload, ours: Timed, peers: dict[int, Timed]) -> dict:
    """The JSON: the workload, OASR, transformers at its best batch (and every batch's rounds), the ratio, and
    whether every side decoded each window's K tokens."""
    audio_s = workload.audio_seconds
    expected = workload.window_lengths
    out = {**header, "audio_seconds": round(audio_s, 1), "num_windows": len(expected),
           "tokens_expected": sum(expected), "oasr": _side(ours, audio_s),
           "oasr_counts_match": ours.counts == expected}
    if peers:
        best_batch = min(peers, key=lambda b: peers[b].best)
        theirs = peers[best_batch]
        out["transformers"] = {**_side(theirs, audio_s), "batch_size": best_batch,
                               "rounds_by_batch": {b: [round(t, 3) for t in p.seconds] for b, p in peers.items()}}
        out["transformers_counts_match"] = all(p.counts == expected for p in peers.values())
        out["rtfx_ratio"] = round(theirs.best / ours.best, 2)
    return out


def encoder_report(ours: OasrLongForm, workload: Workload, config, rounds: int) -> dict:
    """The workload at one token per window: an upper bound on OASR's encoder time, and so a lower bound on the
    TFLOP/s its encoder reaches."""
    one = workload.with_lengths(1)
    seconds = min(ours.run(one)[0] for _ in range(rounds))  # the engine is warm from the timed runs
    num_windows = len(one.window_lengths)
    flops = encoder_flops(config)
    tflops = num_windows * flops / seconds / 1e12
    return {"one_token_seconds": round(seconds, 3), "tflop_per_window": round(flops / 1e12, 3),
            "tflops_at_least": round(tflops, 1), "share_of_fp16_dense": round(tflops / FP16_DENSE_TFLOPS, 3)}


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
    return value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m oasr.bench.longspeech", description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", default="whisper-large-v3", choices=tuple(ARCHES))
    p.add_argument("--recordings", type=_positive_int, default=6, help="long recordings, all transcribed at once")
    p.add_argument("--minutes", type=_positive_float, default=10.0,
                   help="length of each recording (rounded to whole 30 s windows)")
    p.add_argument("--peer", default="transformers", choices=("transformers", "none"))
    p.add_argument("--peer-batch-sizes", type=_positive_int, nargs="+", default=[64, 128])
    p.add_argument("--rounds", type=_positive_int, default=2, help="timed runs of each side, alternating; best counts")
    p.add_argument("--batch-size", type=_positive_int, default=128,
                   help="OASR's batch_size (windows decoding at once), as oasr.transcribe takes it")
    p.add_argument("--memory-gib", type=_positive_float, default=None,
                   help="OASR's K/V memory budget (default: the engine's, 40%% of free GPU memory)")
    p.add_argument("--kv-cache-dtype", default="auto", choices=("auto", "fp8"),
                   help="how OASR holds K/V, cross-attention's included (fp8: e4m3 with a scale per position and head)")
    p.add_argument("--compile-encoder", action="store_true", help="torch.compile OASR's encoder (CUDA)")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "float16", "bfloat16"))
    p.add_argument("--tokenizer", type=Path, default=None,
                   help="multilingual Whisper tokenizer.json (default: the base package's)")
    p.add_argument("--counts-manifest", type=Path, default=None,
                   help="derive the tokens per window from this manifest's transcripts instead of TOKENS_PER_30S")
    p.add_argument("--token-counts", type=_positive_int, nargs="+", default=None,
                   help="draw the tokens per window from these counts instead")
    p.add_argument("--no-encoder-probe", action="store_true", help="skip the one-token run that times the encoder")
    p.add_argument("--profile", action="store_true",
                   help="then run OASR's side once more under torch's profiler, and once at one token per window "
                        "(the encoder's share), tables to stderr")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.tokenizer is not None and not args.tokenizer.is_file():
        p.error(f"--tokenizer {args.tokenizer}: no such file")
    if args.counts_manifest is not None and not args.counts_manifest.is_file():
        p.error(f"--counts-manifest {args.counts_manifest}: no such file")
    if args.token_counts and max(args.token_counts) > MAX_TOKENS_PER_WINDOW:
        p.error(f"--token-counts: at most {MAX_TOKENS_PER_WINDOW} tokens per window, got {max(args.token_counts)}")
    if round(args.minutes * 60 / WINDOW_SECONDS) < 1:
        p.error(f"--minutes {args.minutes}: shorter than one 30 s window")
    return args


def _engine_config(args: argparse.Namespace):
    from oasr.engine.config import CacheConfig, EngineConfig

    base = EngineConfig()
    cache = replace(base.cache, kv_cache_dtype=args.kv_cache_dtype)
    if args.memory_gib is not None:
        cache = replace(cache, memory_budget_bytes=int(args.memory_gib * 2**30))
    return replace(base, cache=cache, runner=replace(base.runner, compile_encoder=args.compile_encoder))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from oasr.bench.random_model import random_whisper
    from oasr.models.embedded import resolve_embedded
    from oasr.models.loader import pick_device, pick_dtype

    device = pick_device(args.device)
    dtype = pick_dtype(None if args.dtype == "auto" else args.dtype, device)
    tokenizer_file = args.tokenizer or resolve_embedded("base").directory / "tokenizer.json"
    loaded, state = random_whisper(ARCHES[args.arch], device=device, dtype=dtype, tokenizer_file=tokenizer_file)
    if args.token_counts:
        counts, source = tuple(args.token_counts), "--token-counts"
    elif args.counts_manifest:
        counts, source = token_counts_from_manifest(args.counts_manifest, loaded.tokenizer), str(args.counts_manifest)
        if not counts:
            raise SystemExit(f"oasr: error: {args.counts_manifest}: no transcript of running speech to count")
    else:
        counts, source = TOKENS_PER_30S, "TOKENS_PER_30S"
    workload = build_workload(args.recordings, args.minutes, counts, args.seed)
    ours = OasrLongForm(loaded, args.batch_size, _engine_config(args))
    peer = PeerLongForm(loaded, state, tokenizer_file) if args.peer == "transformers" else None
    header = {"arch": args.arch, "device": str(device), "dtype": str(dtype).removeprefix("torch."),
              "recordings": args.recordings, "minutes": args.minutes, "oasr_batch_size": args.batch_size,
              "kv_cache_dtype": args.kv_cache_dtype, "token_counts_source": source,
              "tokens_per_window_mean": round(float(np.mean(workload.window_lengths)), 1),
              "peer_path": "pipeline(automatic-speech-recognition, chunk_length_s=30, stride_length_s=0)"}
    ours_timed, peers = run_rounds(ours, peer, workload, args.peer_batch_sizes, args.rounds)
    result = report(header, workload, ours_timed, peers)
    if not args.no_encoder_probe:
        result["oasr_encoder"] = encoder_report(ours, workload, loaded.config, args.rounds)
    print(json.dumps(result, indent=2))
    if args.profile:
        profile_side(ours, workload)
    return 0


def profile_side(ours: OasrLongForm, workload: Workload) -> None:
    """OASR's side under torch's profiler, to stderr: the whole workload, then at one token per window."""
    from contextlib import redirect_stdout

    from oasr.bench.profiling import profile_oasr

    with redirect_stdout(sys.stderr):
        for name, load in (("the workload", workload), ("one token per window", workload.with_lengths(1))):
            print(f"== profile: {name}")
            profile_oasr(lambda load=load: ours.run(load))


if __name__ == "__main__":
    sys.exit(main())
