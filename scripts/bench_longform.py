"""Long-form transcription: wall time and WER of each way of cutting one long recording, on the same audio.

    PYTHONPATH=. python3 scripts/bench_longform.py --model tiny.en --device cuda --minutes 60 --vad none silero sequential

The recording is the shared English speech clips (each at most 30 s; copies of one recording in other formats
left out) joined with 1 s of faint noise, repeated until ``--minutes`` long; its reference is their texts in
order. ``--write PATH`` also saves it as PATH.wav and PATH.txt, for other tools (or a sequential mode) to run on.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import soundfile as sf

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from speech_data import audio_path, manifest_entries

import oasr
from oasr.audio import load_audio
from oasr.bench.wer import word_error_rate
from oasr.transcription.offline import OfflineTranscriber
from oasr.types import TranscribeOptions

SKIP = ("_24bit", "_32bit", "_wav16k", "_8k", "_44k", "stereo_diarization")


def long_recording(minutes: float, gap_s: float = 1.0) -> tuple[np.ndarray, str]:
    entries = [e for e in manifest_entries()
               if e["language"] == "en" and e["duration_s"] <= 30 and not any(s in e["id"] for s in SKIP)]
    if not entries:
        raise SystemExit("no shared speech data found (set OASR_SPEECH_DATA)")
    clips = [load_audio(audio_path(e)) for e in entries]
    rng = np.random.default_rng(0)
    parts, texts, total = [], [], 0
    while total < minutes * 60 * 16000:
        for entry, samples in zip(entries, clips, strict=True):
            gap = (1e-3 * rng.standard_normal(int(gap_s * 16000))).astype(np.float32)
            parts += [samples, gap]
            texts.append(entry["text"])
            total += len(samples) + len(gap)
            if total >= minutes * 60 * 16000:
                break
    return np.concatenate(parts), " ".join(texts)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--batch-size", type=int, default=64, help="windows decoded together")
    parser.add_argument("--vad", nargs="+", default=["none", "silero", "sequential"],
                        help="ways to cut: 'none' is the fixed 30 s cut, a detector name cuts at its silences "
                        "(both parallel), 'sequential' is openai-whisper's seek loop with temperature fallback")
    parser.add_argument("--write", type=Path, default=None, help="also save PATH.wav and PATH.txt")
    args = parser.parse_args()

    samples, reference = long_recording(args.minutes)
    if args.write:
        sf.write(args.write.with_suffix(".wav"), samples, 16000, subtype="FLOAT")
        args.write.with_suffix(".txt").write_text(reference + "\n", encoding="utf-8")
    loaded = oasr.from_pretrained(args.model, device=args.device)
    print(f"{len(samples) / 16000 / 60:.1f} min of audio, {len(reference.split())} reference words, "
          f"{args.model} on {loaded.device}")
    for vad in args.vad:
        if vad == "sequential":
            options = TranscribeOptions(batch_size=args.batch_size, long_form="sequential")
        else:
            options = TranscribeOptions(batch_size=args.batch_size, vad=None if vad == "none" else vad)
        transcriber = OfflineTranscriber(loaded, options)
        next(transcriber.run([samples[: 60 * 16000]]))  # warm-up: CUDA graphs, cuDNN plans
        start = time.perf_counter()
        result = next(transcriber.run([samples]))
        seconds = time.perf_counter() - start
        report = word_error_rate([reference], [result.text])
        print(f"cut={vad:7s} {seconds:8.1f} s  RTFx {len(samples) / 16000 / seconds:7.1f}  WER {report.wer:.4f} "
              f"(sub {report.substitutions}, del {report.deletions}, ins {report.insertions})  "
              f"{len(result.segments)} segments", flush=True)


if __name__ == "__main__":
    main()
