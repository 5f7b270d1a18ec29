"""FrameLayout: a batch's real frames packed row after row, and the padded view the mixing layers need."""

from __future__ import annotations

import pytest
import torch

from oasr.layers.frames import ROW_MULTIPLE, FrameLayout


def test_packed_rows_hold_each_utterances_frames_in_order() -> None:
    lengths = [5, 1, 3]
    x = torch.randn(3, 5, 4)
    layout = FrameLayout.packed(lengths, 5, "cpu")
    rows = layout.pack(x)
    assert layout.is_packed and rows.shape == (ROW_MULTIPLE, 4)
    expected = torch.cat([x[0, :5], x[1, :1], x[2, :3]])
    assert torch.equal(rows[:9], expected)
    assert layout.starts.tolist() == [0, 5, 6] and layout.lengths.tolist() == lengths
    assert layout.mask.tolist() == [[True] * 5, [True] + [False] * 4, [True] * 3 + [False] * 2]


def test_unpack_restores_the_real_frames_and_fills_padding_with_the_utterances_first_frame() -> None:
    lengths = [2, 4]
    x = torch.randn(2, 4, 3)
    layout = FrameLayout.packed(lengths, 4, "cpu")
    view = layout.unpack(layout.pack(x))
    assert view.shape == x.shape
    assert torch.equal(view[layout.mask], x[layout.mask])
    assert torch.equal(view[0, 2], x[0, 0]) and torch.equal(view[0, 3], x[0, 0])  # finite, never read
    assert torch.equal(layout.pack(view)[:6], layout.pack(x)[:6])


def test_padded_layout_leaves_tensors_as_they_are() -> None:
    lengths = torch.tensor([3, 1])
    layout = FrameLayout.padded(lengths, 3)
    x = torch.randn(2, 3, 2)
    assert not layout.is_packed and layout.pack(x) is x and layout.unpack(x) is x
    assert layout.starts.tolist() == [0, 3] and layout.mask.sum().item() == 4


@pytest.mark.parametrize("lengths", [[], [0, 3], [4, 6]])
def test_packing_refuses_lengths_it_cannot_lay_out(lengths: list[int]) -> None:
    with pytest.raises(ValueError, match="packing needs"):
        FrameLayout.packed(lengths, 5, "cpu")
