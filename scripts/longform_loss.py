"""Words the default (parallel) long-form mode keeps, against sequential mode, on the same long audio.

    PYTHONPATH=. python3 scripts/longform_loss.py --model tiny.en --device cpu

The inputs are the shared English clips longer than one window (copies in other formats left out) and two
concatenations of the shared English clips joined with 1 s of faint noise, each at least ``--minutes`` long:
one in manifest order, one in reverse (so the 30 s boundaries fall elsewhere). For each input and mode it
prints the words kept (after Whisper's English normalizer) and the WER against the reference texts, then the
totals: parallel mode keeps words within 1% of sequential mode, at a WER no worse than sequential's + 1 point,
or the script exits with status 1.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from speech_data import audio_path, manifest_entries

import oasr
from oasr.audio import load_audio
from oasr.bench.wer import normalizer, word_error_rate
from oasr.transcription.offline import OfflineTranscriber
from oasr.types import TranscribeOptions

SKIP = ("_24bit", "_32bit", "_wav16k", "_8k", "_44k", "stereo_diarization")
MAX_WORDS_LOST = 0.01
MAX_WER_POINTS_WORSE = 1.0


def english_entries() -> list[dict]:
    entries = [e for e in manifest_entries() if e["language"] == "en" and not any(s in e["id"] for s in SKIP)]
    if not entries:
        raise SystemExit("no shared speech data found (set OASR_SPEECH_DATA)")
    return entries


def concatenation(entries: list[dict], minutes: float, gap_s: float = 1.0) -> tuple[np.ndarray, str]:
    """The clips joined with faint noise, in order, until ``minutes`` long; and their texts."""
    rng = np.random.default_rng(0)
    parts, texts, total = [], [], 0
    for entry in entries:
        samples = load_audio(audio_path(entry))
        gap = (1e-3 * rng.standard_normal(int(gap_s * 16000))).astype(np.float32)
        parts += [samples, gap]
        texts.append(entry["text"])
        total += len(samples) + len(gap)
        if total >= minutes * 60 * 16000:
            break
    return np.concatenate(parts), " ".join(texts)


def inputs(minutes: float) -> list[tuple[str, np.ndarray, str]]:
    entries = english_entries()
    long = [(e["id"], load_audio(audio_path(e)), e["text"]) for e in entries if e["duration_s"] > 30]
    forward = concatenation(entries, minutes)
    backward = concatenation(entries[::-1], minutes)
    return [*long, ("concatenation", *forward), ("concatenation_reversed", *backward)]


def transcribe(model, audio: list[np.ndarray], long_form: str, batch_size: int) -> tuple[list[str], float]:
    start = time.perf_counter()
    options = TranscribeOptions(long_form=long_form, batch_size=batch_size)
    texts = [r.text for r in OfflineTranscriber(model, options).run(audio)]
    return texts, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--minutes", type=float, default=5.0, help="length of each concatenation")
    parser.add_argument("--batch-size", type=int, default=8, help="windows decoded together")
    args = parser.parse_args()
    model = oasr.from_pretrained(args.model, device=args.device, dtype="float32")
    items = inputs(args.minutes)
    audio = [samples for _, samples, _ in items]
    references = [text for _, _, text in items]
    norm = normalizer("en")
    results = {}
    for mode in ("sequential", "parallel"):
        texts, seconds = transcribe(model, audio, mode, args.batch_size)
        results[mode] = texts
        print(f"{mode}: {sum(len(a) for a in audio) / 16000:.0f} s of audio in {seconds:.1f} s")
    columns = ("seconds", "ref words", "seq words", "par words", "seq WER", "par WER")
    print(f"{'input':<28}" + "".join(f"{c:>10}" for c in columns))
    for (name, samples, reference), seq, par in zip(items, results["sequential"], results["parallel"], strict=True):
        wers = [100 * word_error_rate([reference], [text]).wer for text in (seq, par)]
        print(f"{name:<28}{len(samples) / 16000:>10.1f}{len(norm(reference).split()):>10}"
              f"{len(norm(seq).split()):>10}{len(norm(par).split()):>10}{wers[0]:>10.2f}{wers[1]:>10.2f}")
    kept = {mode: sum(len(norm(t).split()) for t in texts) for mode, texts in results.items()}
    wer = {mode: 100 * word_error_rate(references, texts).wer for mode, texts in results.items()}
    ratio = kept["parallel"] / kept["sequential"]
    print(f"words kept: parallel {kept['parallel']}, sequential {kept['sequential']} (ratio {ratio:.4f}); "
          f"WER: parallel {wer['parallel']:.2f}, sequential {wer['sequential']:.2f}")
    ok = abs(ratio - 1) <= MAX_WORDS_LOST and wer["parallel"] <= wer["sequential"] + MAX_WER_POINTS_WORSE
    print("within bounds" if ok else "OUT OF BOUNDS")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
