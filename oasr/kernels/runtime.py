"""Where the Triton kernels can run: on CUDA tensors, or anywhere under Triton's interpreter
(``TRITON_INTERPRET=1``, which the CPU equivalence tests use). Without Triton installed, nowhere."""

from __future__ import annotations

import os

import torch

try:
    import triton
except ImportError:
    triton = None


def triton_runs_on(x: torch.Tensor) -> bool:
    return triton is not None and (x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1")
