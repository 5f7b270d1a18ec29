"""A stand-in for a model's ``cross_kv_into`` in the cross-attention store tests: its K and V are the hidden
states themselves, scaled by the layer's number (V negated), written into buffers or handed to per-layer sinks."""

from __future__ import annotations

import torch


class Projector:
    def cross_kv_into(self, hidden, k_out, v_out):
        for layer in range(len(k_out)):
            for out, sign in ((k_out[layer], 1), (v_out[layer], -1)):
                projected = hidden * sign * (layer + 1)
                if isinstance(out, torch.Tensor):
                    out.copy_(projected)
                else:
                    out(projected.flatten(0, 1))
