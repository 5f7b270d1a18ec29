"""Audio of many lengths -> one zero-padded float32 batch on the device the features are computed on."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

# One thread copies about 7 GB/s; a batch of long clips is hundreds of MB, so big gathers are split over threads.
_COPY_THREADS = 4
_BYTES_PER_THREAD = 16 << 20


def _gather_into(out: torch.Tensor, rows: list[torch.Tensor]) -> None:
    """Copies ``rows`` one after another into ``out`` (1-D), on several threads when there is enough to copy
    (torch releases the GIL for each copy)."""
    offsets = [0]
    for row in rows:
        offsets.append(offsets[-1] + row.shape[0])
    threads = min(_COPY_THREADS, out.numel() * out.element_size() // _BYTES_PER_THREAD)
    if threads < 2:
        torch.cat(rows, out=out)
        return

    def copy(part: int) -> None:
        with torch.inference_mode():  # thread-local: writes into the caller's inference tensors are allowed
            for i in range(part, len(rows), threads):
                out[offsets[i] : offsets[i + 1]].copy_(rows[i])

    with ThreadPoolExecutor(threads, thread_name_prefix="oasr-upload") as pool:
        list(pool.map(copy, range(threads)))


def pad_to_device(
    audio: Sequence[np.ndarray | torch.Tensor], device: torch.device | str, *, width: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """1-D inputs -> (float32 [B, width] zero-padded on ``device``, samples [B] int64 on ``device``).

    ``width``: cut every input to this many samples and pad to it; None pads to the longest input.
    On CUDA, inputs already in pinned memory are copied straight into their rows; the others travel together in
    one copy from a pinned buffer and are placed row by row on the device. (A copy per input from pageable memory
    would wait for the stream before each one and stage every byte through the driver's own buffer.)
    """
    if not audio:
        raise ValueError("no audio to featurize")
    rows = [torch.as_tensor(samples, dtype=torch.float32).reshape(-1) for samples in audio]
    if width is not None:
        rows = [row[:width] for row in rows]
    lengths = [row.shape[0] for row in rows]
    width = max(lengths) if width is None else width
    device = torch.device(device)
    batch = torch.zeros(len(rows), width, dtype=torch.float32, device=device)
    # Inputs already in pinned memory (staged by the engine) go straight into their rows.
    staged = [row.is_pinned() for row in rows] if device.type == "cuda" else [False] * len(rows)
    for i, row in enumerate(rows):
        if staged[i]:
            batch[i, : lengths[i]].copy_(row, non_blocking=True)
    rest = [i for i in range(len(rows)) if not staged[i]]
    if rest:
        if device.type == "cuda":
            host = torch.empty(sum(lengths[i] for i in rest), dtype=torch.float32, pin_memory=True)
            _gather_into(host, [rows[i] for i in rest])
            flat = host.to(device, non_blocking=True)  # the pinned block is not reused before this copy is done
        else:
            flat = torch.cat([rows[i] for i in rest]).to(device)
        offset = 0
        for i in rest:
            batch[i, : lengths[i]] = flat[offset : offset + lengths[i]]
            offset += lengths[i]
    return batch, torch.tensor(lengths, dtype=torch.long).to(device, non_blocking=True)
