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


def per_head_kernel_runs_on(x: torch.Tensor) -> bool:
    """Whether a kernel that tiles one attention head (``x``'s last dim) at a time runs for ``x``: Triton runs on
    it and the head size is a power of two of at least 16 (``tl.arange`` spans a head)."""
    d = x.shape[-1]
    return triton_runs_on(x) and d >= 16 and d & (d - 1) == 0


def residual_rows(x: torch.Tensor, delta: torch.Tensor | None
                  ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """A row-wise norm's buffers for ``x`` [..., D] after an optional residual ``delta``: (x's rows [N, D] dense,
    delta's rows or None, the sum's output rows (x's own rows when there is no delta), the norm's output rows)."""
    dim = x.shape[-1]
    rows = x.reshape(-1, dim)
    if not rows.is_contiguous():
        rows = rows.contiguous()
    normed = torch.empty_like(rows)
    if delta is None:
        return rows, None, rows, normed
    delta = delta.reshape(-1, dim)
    return rows, delta if delta.is_contiguous() else delta.contiguous(), torch.empty_like(rows), normed
