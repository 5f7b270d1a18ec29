"""Host values to the device without waiting for it.

``torch.tensor(values, device="cuda")`` copies from pageable memory, and a blocking copy waits until the device
has finished everything queued before it. Inside a walk that wait empties the device's queue: the host then
launches the rest of the walk while the device sits idle. A walk's indices and flags go up through these
helpers instead: one pinned buffer, one asynchronous copy, queued behind the walk's earlier work. (Torch keeps
a pinned buffer from reuse until the copy that reads it has run.)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def upload_tensor(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on ``device``; on CUDA through pinned memory, without waiting for queued work."""
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def upload(device: torch.device, *columns: Sequence[int] | np.ndarray, dtype: torch.dtype = torch.long
           ) -> tuple[torch.Tensor, ...]:
    """Each column (ints, bools or floats; an array is flattened) as a 1-D ``dtype`` tensor on ``device``, all in
    one copy."""
    arrays = [np.asarray(column).reshape(-1) for column in columns]
    sizes = [a.size for a in arrays]
    flat = np.concatenate(arrays) if arrays else np.zeros(0)
    host = torch.from_numpy(flat.astype(_NUMPY[dtype], copy=False))
    return upload_tensor(host, device).split(sizes)


_NUMPY = {torch.long: np.int64, torch.int32: np.int32, torch.float32: np.float32, torch.float64: np.float64}
