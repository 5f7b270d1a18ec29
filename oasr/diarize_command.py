"""``oasr diarize FILE... --model ID``: who speaks when in each file, as RTTM lines on stdout (or a file)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from oasr.devices import DEVICE_HELP, device_name


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("diarize", help="say who speaks when in audio files (RTTM output)")
    p.add_argument("files", nargs="+", type=Path, help="audio files (any format ffmpeg or libsndfile reads)")
    p.add_argument("--model", required=True,
                   help="a diarization checkpoint: a directory in transformers' layout or a Hub id ORG/NAME")
    p.add_argument("--device", default="auto", type=device_name, help=DEVICE_HELP)
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "float16", "bfloat16"))
    p.add_argument("--threshold", type=float, default=0.5,
                   help="speaker probability over which a frame counts as that speaker's speech")
    p.add_argument("-o", "--output", type=Path, default=None, help="write the RTTM here instead of stdout")


def run(args: argparse.Namespace) -> int:
    from oasr.audio import load_audio
    from oasr.diarization.loader import load_diarizer
    from oasr.diarization.offline import OfflineDiarizer
    from oasr.diarization.rttm import rttm_lines
    from oasr.errors import OASRError

    if not 0.0 < args.threshold < 1.0:
        raise OASRError(f"--threshold must lie between 0 and 1, got {args.threshold}")
    audio = [load_audio(path) for path in args.files]  # every file decodes before the model loads
    diarizer = OfflineDiarizer(load_diarizer(args.model, device=args.device, dtype=args.dtype),
                               threshold=args.threshold)
    results = diarizer.diarize(audio, [str(path) for path in args.files])
    text = "".join(line + "\n" for result in results for line in rttm_lines(result))
    if args.output is None:
        from oasr.transcribe_command import _print

        _print(text)
        return 0
    try:
        args.output.write_text(text, encoding="utf-8")
    except OSError as exc:
        print(f"oasr: error: diarize: cannot write {args.output}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0
