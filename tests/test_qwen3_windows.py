"""The Qwen3-ASR encoder's window plan: every request's positions go into windows of its own, eight chunks at a
time, and come back out in order; checked by labelling every chunk position and following the labels."""

from __future__ import annotations

import pytest
import torch

from oasr.models.qwen3_asr.encoder import encoder_positions
from oasr.models.qwen3_asr.windows import WindowPlan, positions_of

CHUNK, PER_WINDOW = 100, 8


@pytest.mark.parametrize("frames", [[1], [100], [799, 800, 801], [1650, 37, 100, 2000, 5, 1599]])
def test_positions_follow_their_request_window_by_window(frames: list[int]) -> None:
    chunks_per_row = max(-(-n // CHUNK) for n in frames) + 1  # the batch's padded chunks, one spare
    plan = WindowPlan.build(frames, chunks_per_row, CHUNK, PER_WINDOW, torch.device("cpu"))
    per_chunk = positions_of(CHUNK)
    # Label chunk positions (row, chunk in row, position in chunk) as the encoder's first stage lays them out.
    labels = [(chunk // chunks_per_row, chunk % chunks_per_row, p) for chunk in plan.chunks.tolist()
              for p in range(per_chunk)] + [None]
    windows = [labels[i] for i in plan.into_windows.tolist()]
    keys = plan.keys.flatten().tolist()
    assert plan.window == per_chunk * PER_WINDOW and len(windows) == plan.num_windows * plan.window
    for w in range(plan.num_windows):
        real = [lab for lab, key in zip(windows[w * plan.window:(w + 1) * plan.window],
                                        keys[w * plan.window:(w + 1) * plan.window]) if key]
        assert real, "every window holds a real position"
        assert len({row for row, _, _ in real}) == 1, "a window holds one request"
        assert len({c // PER_WINDOW for _, c, _ in real}) == 1, "a window holds eight chunks of it"
    out = [[windows[i] if i < len(windows) else None for i in indices] for indices in plan.out_of_windows.tolist()]
    for row, n in enumerate(frames):
        want = [(row, c, p) for c in range(-(-n // CHUNK))
                for p in range(positions_of(min(CHUNK, n - c * CHUNK)))]
        assert plan.counts[row] == len(want) == encoder_positions(n, CHUNK)
        assert out[row][: len(want)] == want
        assert all(x is None for x in out[row][len(want):])


@pytest.mark.parametrize(("stride", "padding", "size"), [(2, 1, (128, 100)), (2, 1, (9, 7)), (1, 0, (6, 11))])
def test_one_channel_conv_equals_the_convolution_in_channels_last_memory(stride: int, padding: int,
                                                                         size: tuple[int, int]) -> None:
    from oasr.layers import Conv2d
    from oasr.models.qwen3_asr.encoder import one_channel_conv

    torch.manual_seed(0)
    conv = Conv2d(1, 24, 3, stride, padding=padding)
    x = torch.randn(3, 1, *size)
    got = one_channel_conv(conv, x)
    assert got.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(got, conv(x), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="one input channel"):
        one_channel_conv(Conv2d(2, 24, 3), torch.randn(3, 2, *size))
