"""The streaming state pool: gathered fields are copies scattered back, ring fields keep each stream's latest
frames in place and read back in order, whatever the chunk size and however often the ring wraps."""

from __future__ import annotations

import pytest
import torch

from oasr.streaming.geometry import StateField
from oasr.streaming.state_pool import StreamStatePool

LAYERS, HEADS, FRAMES, WIDTH = 3, 2, 5, 4


def _pool(num_slots: int = 4) -> StreamStatePool:
    return StreamStatePool((StateField("conv", (LAYERS, 2, WIDTH)),
                            StateField("keys", (LAYERS, HEADS, FRAMES, WIDTH), ring=True)),
                           num_slots, torch.device("cpu"), torch.float32)


@pytest.mark.parametrize("chunk", [1, 2, 3, 5, 7])
def test_a_ring_reads_back_each_streams_latest_frames_in_order(chunk: int) -> None:
    pool = _pool()
    slots = torch.tensor([2, 0, 3])
    history = [[] for _ in slots]  # every frame each row's stream has appended: [LAYERS, HEADS, WIDTH] each
    generator = torch.Generator().manual_seed(chunk)
    for step in range(6):
        rows = pool.gather(slots, torch.full((len(slots),), step * chunk))["keys"]
        for layer in range(LAYERS):
            window = rows.window(layer, chunk)
            assert window.shape == (len(slots), HEADS, FRAMES + chunk, WIDTH)
            for row, frames in enumerate(history):
                past = [f[layer] for f in frames[-FRAMES:]]
                if past:  # the newest frames end the past part; older positions hold zeros before the start
                    assert torch.equal(window[row, :, FRAMES - len(past):FRAMES], torch.stack(past, 1))
                assert not window[row, :, : FRAMES - len(past)].any()
        new = torch.randn(len(slots), LAYERS, HEADS, chunk, WIDTH, generator=generator)
        for layer in range(LAYERS):
            rows.append(layer, new[:, layer])
        for row, frames in enumerate(history):
            frames.extend(new[row, :, :, t] for t in range(chunk))
    assert not pool.tensors["keys"][1].any()  # a slot in no step is untouched


def test_gathered_fields_are_copies_and_rings_cannot_be_scattered() -> None:
    pool = _pool()
    slots = torch.tensor([1])
    with pytest.raises(ValueError, match="ring"):
        pool.gather(slots)
    rows = pool.gather(slots, torch.zeros(1, dtype=torch.long))
    rows["conv"] += 1
    assert not pool.tensors["conv"].any()
    pool.scatter(slots, {"conv": rows["conv"]})
    assert pool.tensors["conv"][1].eq(1).all() and not pool.tensors["conv"][0].any()
    with pytest.raises(ValueError, match="ring"):
        pool.scatter(slots, {"keys": torch.zeros(1, LAYERS, HEADS, FRAMES, WIDTH)})


def test_a_ring_field_needs_a_frame_axis_and_a_width() -> None:
    with pytest.raises(ValueError, match="ring"):
        StateField("keys", (FRAMES, WIDTH), ring=True)
