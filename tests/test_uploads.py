"""``oasr.uploads``: a walk's host values reach the device as they were, each column its own tensor."""

from __future__ import annotations

import numpy as np
import torch

from oasr.uploads import upload


def test_columns_of_mixed_kinds_come_back_in_order_and_shape():
    table = np.arange(6).reshape(2, 3)
    a, flags, flat, empty = upload(torch.device("cpu"), [5, 7], [True, False, True], table, [])
    assert a.tolist() == [5, 7] and a.dtype == torch.long
    assert flags.bool().tolist() == [True, False, True]
    assert flat.view(2, 3).tolist() == table.tolist()
    assert empty.numel() == 0


def test_float_columns_keep_their_values():
    (t,) = upload(torch.device("cpu"), [0.0, 0.2, 1.5], dtype=torch.float32)
    assert t.dtype == torch.float32 and torch.allclose(t, torch.tensor([0.0, 0.2, 1.5]))
