"""What ``--device`` accepts: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``. Only the spelling is checked here (no
torch import, so ``--help`` stays fast); whether GPU N exists is checked when the model loads
(``oasr.models.loader.pick_device``)."""

from __future__ import annotations

import argparse
import re

DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:\d+)?")
DEVICE_HELP = "where the model runs: auto (CUDA when there is a GPU, else the CPU), cpu, cuda, or cuda:N for GPU N"


def device_name(text: str) -> str:
    """``argparse`` type of every ``--device``: the name unchanged, or a usage error naming the choices."""
    if DEVICE_PATTERN.fullmatch(text):
        return text
    raise argparse.ArgumentTypeError(f"invalid device {text!r}: choose auto, cpu, cuda or cuda:N (N a GPU index)")


def is_cuda(device: str) -> bool:
    return device == "cuda" or device.startswith("cuda:")
