"""Layers of the waist whose forward differs from the torch module they extend."""

from __future__ import annotations

import torch

from oasr.layers import Float32Head, PointwiseConv1d


def test_float32_head_projects_half_inputs_in_float32() -> None:
    torch.manual_seed(0)
    head = Float32Head(16, 7, bias=True).half()
    x = torch.randn(3, 16).half()
    logits = head(x)
    assert logits.dtype == torch.float32
    expected = x.float() @ head.weight.float().T + head.bias.float()
    assert torch.equal(logits, expected)
    assert list(head.state_dict()) == ["weight", "bias"]  # the float32 copy is not a checkpoint key


def test_float32_head_follows_its_weight_when_it_is_written_or_moved() -> None:
    head = Float32Head(4, 3, bias=False).half()
    x = torch.randn(2, 4).half()
    head(x)
    with torch.no_grad():
        head.weight.mul_(2)  # in place: same storage, new contents
    assert torch.equal(head(x), x.float() @ head.weight.float().T)
    head.float()
    assert torch.equal(head(x.float()), x.float() @ head.weight.T)


def test_pointwise_conv_on_channel_last_input_equals_the_convolution() -> None:
    torch.manual_seed(0)
    layer = PointwiseConv1d(6, 5)
    x = torch.randn(2, 9, 6)  # [B, T, C]
    reference = torch.nn.functional.conv1d(x.transpose(1, 2), layer.weight, layer.bias).transpose(1, 2)
    assert torch.allclose(layer(x), reference, atol=1e-6)
    assert layer.weight.shape == (5, 6, 1)  # checkpoint layout of a kernel-size-1 convolution
