"""The path a beam search kept, read back from its per-step back-pointers: every search here records, at each step,
each beam's parent and what the step added to it, and walks back once at the end."""

from __future__ import annotations

import torch


def follow_back_pointers(parents: torch.Tensor, beams: torch.Tensor, *steps: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """parents: [T, B, K] each step's parent beam; beams: [B] each row's beam after the last step; steps: [T, B, K]
    each, what a step wrote for each beam -> for each of ``steps``, [T, B]: what each step wrote on the path that
    ends at ``beams``. All rows walk back together, on the tensors' device."""
    rows = torch.arange(beams.shape[0], device=beams.device)
    paths = tuple(torch.empty(step.shape[:2], dtype=step.dtype, device=step.device) for step in steps)
    for index in reversed(range(parents.shape[0])):
        for path, step in zip(paths, steps, strict=True):
            path[index] = step[index, rows, beams]
        beams = parents[index, rows, beams]
    return paths
