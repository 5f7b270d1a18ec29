"""Paraformer-large and SenseVoice-Small shapes with random weights: OASR's engine against FunASR's
``AutoModel(model=DIR).generate`` on the same folder and audio in the same run (issue 38's target: >= 5x).

H200 (one JSON line per model; one model a command keeps each under the 10-minute limit)::

    for w in wheels/funasr/*.whl; do python -m zipfile -e "$w" /tmp/funasr_site; done
    PYTHONPATH=$PWD:/tmp/funasr_site python -m oasr.bench.funasr --arch paraformer-large \\
        --num-utterances 1024 --device cuda
    PYTHONPATH=$PWD:/tmp/funasr_site python -m oasr.bench.funasr --arch sense-voice-small \\
        --num-utterances 1024 --device cuda

Both folders, written here without funasr, load in funasr 1.4.16 with "All keys matched successfully"
(220.1 M parameters for Paraformer-large, 234.0 M for SenseVoice-Small, as published).

``--peer none`` runs OASR alone (no funasr import), e.g. where funasr cannot be carried::

    PYTHONPATH=$PWD python -m oasr.bench.funasr --arch paraformer-large sense-voice-small --num-utterances 1024 \\
        --device cuda --peer none

funasr on a machine without pip: the smallest wheel set that imports ``AutoModel`` and runs ``generate`` for
Paraformer and SenseVoice on top of torch and OASR's declared dependencies (found by removing each in turn from
an environment holding only those; 5.3 MB in all). Wheels unpack with ``python -m zipfile -e`` (no pip needed);
the two binary ones are built for CPython 3.11 (take the machine's ``cpXY`` tags if it runs another Python)::

    funasr-1.4.16-py3-none-any.whl                                                   1.0 MB
    omegaconf-2.4.0-py3-none-any.whl                                                 0.25 MB
    kaldiio-2.18.1-py3-none-any.whl                                                  0.03 MB
    librosa-0.11.0-py3-none-any.whl                                                  0.26 MB  (imported, not run)
    lazy_loader-0.6-py3-none-any.whl                                                 0.01 MB
    six-1.17.0-py2.py3-none-any.whl                                                  0.01 MB
    rapidfuzz-3.14.6-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl     3.2 MB
    kaldi_native_fbank-1.23.0-cp311-cp311-manylinux2014_x86_64.manylinux_2_17_x86_64.whl  0.5 MB  (FunASR's
        fbank when torchaudio is absent)

(``pip download --no-deps funasr==1.4.16 omegaconf==2.4.0 kaldiio==2.18.1 librosa==0.11.0 lazy_loader==0.6
six==1.17.0 rapidfuzz==3.14.6 kaldi-native-fbank==1.23.0``.) funasr's other imports fail softly: its model
registry skips modules that cannot import (SenseVoice's whisper_lib wants numba, which is not needed here).

FunASR's side: without a VAD model ``generate`` batches ``batch_size`` clips at a time in input order
(``batch_size_s``, seconds per batch, is read only on its VAD path), so its knob is swept:
``--peer-batch-sizes`` in input order and longest first; the best counts. It runs in float32 (FunASR's default);
OASR in ``--dtype`` (default: bf16 on CUDA). ``matching_texts`` is the share of clips whose text (tags and spaces
removed) is the same on both sides: 1.0 expected with ``--dtype float32``, lower in bf16 on random weights.
Audio is noise of 2-20 s as in the other benches.
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import time
from pathlib import Path

import numpy as np

from oasr.bench.funasr_models import FUNASR_SHAPES, write_funasr_folder
from oasr.bench.parakeet import sync, synthetic_audio

_TAG = re.compile(r"<\|[^|]*\|>|\s+")


def comparable(text: str) -> str:
    """A text with SenseVoice's ``<|...|>`` tags and all spacing removed (the sides space CJK differently)."""
    return _TAG.sub("", text)


def run_oasr(loaded, audio: list[np.ndarray], engine) -> tuple[float, list[str]]:
    from oasr.types import DecodeOptions

    sync(loaded.device)
    start = time.perf_counter()
    out = {o.request_id: o.token_ids for o in engine.run((f"r{i}", a, DecodeOptions()) for i, a in enumerate(audio))}
    sync(loaded.device)
    seconds = time.perf_counter() - start
    return seconds, [loaded.tokenizer.decode(out[f"r{i}"]) for i in range(len(audio))]


def run_funasr(auto, audio: list[np.ndarray], batch_size: int, device) -> tuple[float, list[str]]:
    # SenseVoice: the request OASR serves by default (language detected, ITN on); FunASR's default is ITN off.
    options = {"language": "auto", "use_itn": True} if type(auto.model).__name__ == "SenseVoiceSmall" else {}
    sync(device)
    start = time.perf_counter()
    results = auto.generate(input=audio, batch_size=batch_size, disable_pbar=True, **options)
    sync(device)
    return time.perf_counter() - start, [r["text"] for r in results]


def bench_funasr_peer(folder: Path, audio: list[np.ndarray], args, device) -> dict:
    """FunASR's best over batch sizes and two orders (input, longest first), with its texts in input order."""
    from funasr import AutoModel

    auto = AutoModel(model=str(folder), device=str(device), disable_update=True, disable_pbar=True,
                     log_level="ERROR")
    order = sorted(range(len(audio)), key=lambda i: -len(audio[i]))
    by_length = [audio[i] for i in order]
    run_funasr(auto, audio[: max(args.peer_batch_sizes)], max(args.peer_batch_sizes), device)  # warm-up
    timings, best = {}, None
    for batch_size in args.peer_batch_sizes:
        for name, clips in (("input_order", audio), ("longest_first", by_length)):
            seconds, texts = run_funasr(auto, clips, batch_size, device)
            timings[f"{name}/{batch_size}"] = round(seconds, 3)
            if name == "longest_first":
                texts = [texts[order.index(i)] for i in range(len(audio))]
            if best is None or seconds < best[0]:
                best = (seconds, texts, f"{name}/{batch_size}")
    return {"seconds": best[0], "texts": best[1], "best": best[2], "timings": timings}


def bench_arch(arch: str, audio: list[np.ndarray], args, device, dtype) -> dict:
    from oasr.engine.config import EngineConfig, SchedulerConfig
    from oasr.engine.engine import ASREngine
    from oasr.models.loader import from_pretrained

    audio_s = sum(len(a) for a in audio) / 16000
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_funasr_folder(arch, Path(tmp) / arch)
        loaded = from_pretrained(folder, device=device, dtype=dtype)
        by_rows, ours_s, ours = {}, None, None
        for rows in args.max_encode_rows:  # OASR's batch knob, swept as FunASR's is; its best counts
            engine = ASREngine(loaded, EngineConfig(scheduler=SchedulerConfig(
                max_num_seqs=256, max_encode_rows=rows,
                # 20 s is 2001 fbank frames, 334 LFR frames: the cap never splits a batch of max rows.
                max_encoder_frames=rows * 2001)))
            run_oasr(loaded, audio, engine)  # warm-up
            by_rows[str(rows)] = []  # JSON keys are strings
            for _ in range(args.rounds):
                seconds, texts = run_oasr(loaded, audio, engine)
                by_rows[str(rows)].append(round(seconds, 3))
                if ours_s is None or seconds < ours_s:
                    ours_s, ours, best_rows = seconds, texts, rows
            del engine
        peer = bench_funasr_peer(folder, audio, args, device) if args.peer == "funasr" else None
    result = {"arch": arch, "device": str(device), "dtype": str(dtype), "utterances": len(audio),
              "audio_seconds": round(audio_s, 1),
              "oasr": {"seconds": round(ours_s, 3), "audio_seconds_per_second": round(audio_s / ours_s, 1),
                       "max_encode_rows": best_rows, "rounds": by_rows,
                       "tokens_per_clip": round(float(np.mean([len(comparable(t)) for t in ours])), 1)}}
    if peer is None:
        return {**result, "funasr": {"skipped": "--peer none"}}
    same = np.mean([comparable(a) == comparable(b) for a, b in zip(ours, peer["texts"], strict=True)])
    return {**result,
            "funasr": {"seconds": round(peer["seconds"], 3), "best": peer["best"],
                       "audio_seconds_per_second": round(audio_s / peer["seconds"], 1), "timings": peer["timings"]},
            "speedup": round(peer["seconds"] / ours_s, 2), "matching_texts": round(float(same), 3)}


def main(argv: list[str] | None = None) -> list[dict]:
    from oasr.models.loader import pick_device, pick_dtype

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", nargs="+", default=["paraformer-large", "sense-voice-small"],
                        choices=sorted(FUNASR_SHAPES))
    parser.add_argument("--num-utterances", type=int, default=1024)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--peer", choices=("funasr", "none"), default="funasr")
    parser.add_argument("--peer-batch-sizes", type=int, nargs="+", default=[16, 64, 128])
    parser.add_argument("--max-encode-rows", type=int, nargs="+", default=[64],
                        help="OASR's clips per encoder batch, each swept like FunASR's batch sizes; the best counts")
    parser.add_argument("--rounds", type=int, default=2, help="timed OASR runs of each batch size; the fastest counts")
    args = parser.parse_args(argv)
    device = pick_device(args.device)
    dtype = pick_dtype(None if args.dtype == "auto" else args.dtype, device)
    audio = synthetic_audio(args.num_utterances)
    results = []
    for arch in args.arch:
        results.append(bench_arch(arch, audio, args, device, dtype))
        print(json.dumps(results[-1]), flush=True)
    return results


if __name__ == "__main__":
    main()
