"""Times word timestamps for a batch of decoded windows: encoder pass, alignment pass + DTW, on any device.

    python scripts/bench_word_timestamps.py --model base --device cuda --dtype float16 --rows 16
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

import oasr
from oasr.audio import load_audio
from oasr.models.whisper.alignment import AlignmentRow, frames_of, word_timings

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from speech_data import audio_path, english_short  # noqa: E402


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    loaded = oasr.from_pretrained(args.model, device=args.device, dtype=args.dtype)
    audio = [load_audio(audio_path(e), channel=e.get("channel")) for e in english_short()][: args.rows]
    decoded = oasr.transcribe(audio, loaded, language="en" if loaded.config.is_multilingual else None)
    rows = [
        AlignmentRow(tuple(r.token_ids), frames_of(len(a), loaded.features.config.n_frames), language="en")
        for r, a in zip(decoded, audio, strict=True)
    ]
    features = loaded.features(audio, device=loaded.device)
    with torch.inference_mode():
        encoder_out = loaded.model.encode(features)
    words = word_timings(loaded.model, loaded.tokenizer, rows, encoder_out=encoder_out)  # warm-up
    for name, call in (
        ("encoder", lambda: loaded.model.encode(features)),
        ("alignment", lambda: word_timings(loaded.model, loaded.tokenizer, rows, encoder_out=encoder_out)),
    ):
        synchronize(loaded.device)
        start = time.perf_counter()
        with torch.inference_mode():
            for _ in range(args.repeats):
                call()
        synchronize(loaded.device)
        print(f"{name}: {(time.perf_counter() - start) / args.repeats * 1000:.1f} ms per batch of {len(rows)}")
    print(f"{sum(len(w) for w in words)} words; first window: {[(w.word, w.start, w.end) for w in words[0][:5]]}")


if __name__ == "__main__":
    main()
