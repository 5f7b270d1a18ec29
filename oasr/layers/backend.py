"""The ``torch`` / ``kernels`` backend switch of the layer waist.

``torch`` runs every layer with plain PyTorch ops. ``kernels`` replaces a layer's forward with a Triton kernel
from ``oasr.kernels`` where one exists. Ops without a kernel yet are *declared gaps*: they are listed by
``kernel_gaps()`` (and ``oasr models``), and selecting ``kernels`` reports which gaps a model hits instead of
falling back silently.
"""

from __future__ import annotations

import logging
from typing import Literal

from torch import nn

from oasr.kernels import DECLARED_GAPS, KERNELS, KernelGap

Backend = Literal["torch", "kernels"]
BACKENDS: tuple[Backend, ...] = ("torch", "kernels")

log = logging.getLogger(__name__)


def kernel_gaps() -> list[KernelGap]:
    return list(DECLARED_GAPS)


def apply_backend(model: nn.Module, backend: Backend) -> list[KernelGap]:
    """Switch ``model``'s layers to ``backend``; returns the declared gaps the model hits (empty for torch).

    Under ``kernels``, a module whose op has a kernel (``oasr.kernels.KERNELS``) runs it on CUDA tensors (plain
    torch elsewhere), and the submodules that kernel absorbs are not counted as gaps."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown layer backend {backend!r}; choose one of {', '.join(BACKENDS)}")

    absorbed: set[int] = set()
    for module in model.modules():
        op = getattr(type(module), "KERNEL_OP", None)
        if op in KERNELS:
            module.use_kernel = backend == "kernels"
            absorbed.update(id(m) for m in module.modules() if getattr(type(m), "KERNEL_OP", None) in KERNELS[op])
    if backend == "torch":
        return []
    gaps = {gap.op: gap for gap in kernel_gaps()}
    used_ops = {getattr(type(m), "KERNEL_OP", None) for m in model.modules() if id(m) not in absorbed}
    hit = [gaps[op] for op in sorted(op for op in used_ops if op in gaps)]
    if hit:
        log.info(
            "kernels backend: %d op(s) of this model have no kernel yet and run on torch: %s",
            len(hit),
            ", ".join(g.op for g in hit),
        )
    return hit
