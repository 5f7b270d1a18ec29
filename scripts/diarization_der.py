"""Diarization error rate of a diarization checkpoint on mixtures of the shared speech clips whose speaker turns are
known, scored by ``pyannote.metrics`` (``DiarizationErrorRate``; the ``test`` extra installs it).

    python scripts/diarization_der.py --model ./Nemotron-3-Diarization [--device cuda] [--collar 0.25]

Two mixtures, each the sum of one track per speaker, so each speaker's turns are where that speaker's own track
is loud (20 ms frames more than ``MARGIN_DB`` over the track's noise floor, gaps under ``MIN_GAP_S`` bridged,
bursts under ``MIN_SPEECH_S`` dropped):
- ``stereo``: faster-whisper's stereo_diarization.wav, two real speakers recorded on two channels, talking over
  each other; the channels summed.
- ``turns``: three speakers of the shared set (a LibriVox reader, the TIMIT sample's speaker, a LibriSpeech
  speaker) one after another, each starting 0.5 s before the one before ends.

Prints one JSON object per mixture: DER and its parts (seconds of missed speech, false alarm, confusion, total
reference speech), with the collar given (0.25 s, md-eval's usual, by default) and overlapped speech scored.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_RATE = 16000
FRAME = SAMPLE_RATE // 50  # 20 ms
MARGIN_DB, FLOOR_PERCENTILE = 10.0, 10.0
MIN_GAP_S, MIN_SPEECH_S = 0.3, 0.1
TURN_CLIPS = ("ps_librivox_0880", "ds_ldc93s1", "mfa_librispeech_61-70968-0000")
TURN_OVERLAP_S = 0.5

Turn = tuple[float, float, str]  # start s, end s, speaker


def track_turns(track: np.ndarray, speaker: str) -> list[Turn]:
    """Where one speaker's own track is loud: frames over its noise floor by MARGIN_DB, short gaps bridged and
    short bursts dropped."""
    frames = track[: len(track) // FRAME * FRAME].reshape(-1, FRAME).astype(np.float64)
    level = 10 * np.log10((frames**2).mean(axis=1) + 1e-12)
    active = level > np.percentile(level, FLOOR_PERCENTILE) + MARGIN_DB
    runs, start = [], None
    for i, on in enumerate([*active, False]):
        if on and start is None:
            start = i
        elif not on and start is not None:
            runs.append([start, i])
            start = None
    frame_s = FRAME / SAMPLE_RATE
    merged: list[list[int]] = []
    for run in runs:
        if merged and (run[0] - merged[-1][1]) * frame_s < MIN_GAP_S:
            merged[-1][1] = run[1]
        else:
            merged.append(run)
    return [(round(s * frame_s, 3), round(e * frame_s, 3), speaker) for s, e in merged
            if (e - s) * frame_s >= MIN_SPEECH_S]


def score(reference: Sequence[Turn], hypothesis: Sequence[Turn], collar: float = 0.25,
          uem: tuple[float, float] | None = None) -> dict[str, float]:
    """DER of ``hypothesis`` against ``reference`` (speaker names need not match: the metric maps them), with
    overlapped speech scored; ``uem``: the stretch scored (default: both extents). Times in seconds."""
    from pyannote.core import Annotation, Segment, Timeline
    from pyannote.metrics.diarization import DiarizationErrorRate

    def annotation(turns: Sequence[Turn]) -> Annotation:
        found = Annotation()
        for i, (start, end, speaker) in enumerate(turns):
            if end > start:
                found[Segment(start, end), i] = speaker
        return found

    metric = DiarizationErrorRate(collar=2 * collar, skip_overlap=False)  # pyannote's collar is the full width
    ref, hyp = annotation(reference), annotation(hypothesis)
    scored = Timeline([Segment(*uem)]) if uem else None
    parts = metric(ref, hyp, detailed=True, uem=scored)
    return {"der": parts["diarization error rate"], "missed_s": parts["missed detection"],
            "false_alarm_s": parts["false alarm"], "confusion_s": parts["confusion"], "speech_s": parts["total"]}


def mixtures() -> dict[str, tuple[np.ndarray, list[Turn]]]:
    """Each mixture's samples and its reference turns."""
    sys.path.insert(0, str(ROOT / "tests"))
    from speech_data import audio_path, clips, manifest_entries  # the shared set, as the tests find it

    import soundfile as sf

    entry = next(e for e in manifest_entries() if e["id"] == "fw_stereo_diarization_left")
    stereo, rate = sf.read(audio_path(entry), dtype="float32")
    if rate != SAMPLE_RATE:
        raise SystemExit(f"{audio_path(entry)}: expected 16 kHz, found {rate}")
    found = {"stereo": (stereo.sum(axis=1), track_turns(stereo[:, 0], "left") + track_turns(stereo[:, 1], "right"))}
    parts = [c.audio for c in clips(TURN_CLIPS)]
    overlap = int(TURN_OVERLAP_S * SAMPLE_RATE)
    total = sum(len(p) for p in parts) - overlap * (len(parts) - 1)
    mixed, turns, at = np.zeros(total, dtype=np.float32), [], 0
    for name, part in zip(TURN_CLIPS, parts):
        track = np.zeros(total, dtype=np.float32)
        track[at : at + len(part)] = part
        mixed += track
        turns += track_turns(track, name)
        at += len(part) - overlap
    found["turns"] = (mixed, turns)
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a diarization checkpoint: directory or Hub id")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--threshold", type=float, default=0.5)
    parser.add_argument("--collar", type=float, default=0.25, help="seconds forgiven on each side of a boundary")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from oasr.diarization.loader import load_diarizer
    from oasr.diarization.offline import OfflineDiarizer

    diarizer = OfflineDiarizer(load_diarizer(args.model, device=args.device), threshold=args.threshold)
    for name, (audio, reference) in mixtures().items():
        (result,) = diarizer.diarize([audio], [name])
        hypothesis = [(s.start, s.end, s.label) for s in result.segments]
        row = {"mixture": name, "model": args.model, "collar_s": args.collar, "duration_s": result.duration,
               "num_reference_speakers": len({t[2] for t in reference}), "num_found_speakers": result.num_speakers,
               **score(reference, hypothesis, args.collar, uem=(0.0, result.duration))}
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
