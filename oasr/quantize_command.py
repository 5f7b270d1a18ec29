"""``oasr quantize SRC DST --method fp8|int8``: a full-precision checkpoint -> a quantized native checkpoint."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path


def _calibration(manifest: Path | None):
    from oasr.quantization.smooth import Calibration
    from oasr.scale.inputs import read_manifest

    if manifest is None:
        return None
    entries = read_manifest(manifest)
    if not entries:
        raise ValueError(f"calibration manifest {manifest} has no entries")
    return Calibration(tuple(e.path for e in entries), f"{manifest.name} ({len(entries)} inputs)")


def run(args: argparse.Namespace) -> int:
    import torch

    from oasr.models import ARCHITECTURES
    from oasr.models.checkpoint import Checkpoint
    from oasr.models.converters.native import save_native
    from oasr.models.loader import from_pretrained
    from oasr.quantization.apply import quantize_model
    from oasr.transcription.offline import calibration_feed

    destination: Path = args.destination
    if destination.exists() and not destination.is_dir():
        print(f"oasr: error: quantize: {destination} exists and is not a directory", file=sys.stderr)
        return 2
    try:
        calibration = _calibration(args.calibration)
    except ValueError as exc:
        print(f"oasr: error: quantize: {exc}", file=sys.stderr)
        return 2
    # Quantized on the host in float32, on the torch backend, so the calibration hooks see every norm.
    loaded = from_pretrained(args.source, device="cpu", dtype="float32", backend="torch", keep_checkpoint=True)
    spec = quantize_model(loaded, args.method, calibration=calibration, feed=calibration_feed, alpha=args.alpha,
                          decode_steps=args.decode_steps)
    tied = ARCHITECTURES.get(loaded.architecture).tied_keys
    state = {k: v for k, v in loaded.model.state_dict().items() if k not in tied}
    checkpoint = Checkpoint(loaded.architecture, loaded.config.to_dict(), state, loaded.checkpoint.tokenizer_file,
                            "native", quantization=spec, tokenizer=loaded.checkpoint.tokenizer)
    created = not destination.exists()
    try:
        save_native(checkpoint, destination, dtype=getattr(torch, args.dtype))
    except OSError as exc:
        if created:
            shutil.rmtree(destination, ignore_errors=True)
        print(f"oasr: error: quantize: cannot write {destination}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    smoothing = ""
    if spec.smoothing is not None:
        smoothing = f", SmoothQuant alpha {spec.smoothing.alpha} from {spec.smoothing.calibration}"
    print(f"wrote {loaded.architecture} ({spec.method}: {len(spec.modules)} GEMMs{smoothing}) to {destination}")
    return 0
