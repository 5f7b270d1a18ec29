"""The FastConformer subsampling kernels (oasr.kernels.subsampling) against their torch references and the
module's torch path: on CPU through Triton's interpreter, on CUDA natively (marked gpu)."""

from __future__ import annotations

import textwrap

import pytest
import torch
from test_kernels import worst_error_interpreted

from oasr.models.fastconformer.config import FastConformerEncoderConfig
from oasr.models.fastconformer.encoder import ConvSubsampling, frame_mask

pytest.importorskip("triton")


def subsampling_module(mels: int = 17, channels: int = 12, factor: int = 8, hidden: int = 16) -> ConvSubsampling:
    config = FastConformerEncoderConfig(hidden_size=hidden, num_attention_heads=4, subsampling_conv_channels=channels,
                                        num_mel_bins=mels, subsampling_factor=factor)
    return ConvSubsampling(config).eval()


def padded_features(lengths: list[int], num_frames: int, mels: int, **like) -> tuple[torch.Tensor, torch.Tensor]:
    lengths_t = torch.tensor(lengths, device=like.get("device"))
    x = torch.randn(len(lengths), num_frames, mels, **like)
    return x * frame_mask(lengths_t, num_frames)[..., None].to(x.dtype), lengths_t


def real_frame_error(got: tuple[torch.Tensor, torch.Tensor], want: tuple[torch.Tensor, torch.Tensor]) -> float:
    """Largest difference at real output frames; the lengths must agree exactly."""
    assert torch.equal(got[1], want[1]) and got[0].shape == want[0].shape
    real = frame_mask(want[1], want[0].shape[1])
    return (got[0].float() - want[0].float())[real].abs().max().item()


def test_channels_last_path_of_the_references_equals_the_torch_stack() -> None:
    # On CPU without the interpreter the kernels' references serve, so this pins the channels-last layout, the
    # pointwise convs as matrix multiplies, the permuted linear weight and the lengths, independently of Triton.
    torch.manual_seed(0)
    for factor in (4, 8, 16):
        module = subsampling_module(factor=factor)
        x, lengths = padded_features([41, 1, 0, 20, 33], 41, 17)
        with torch.inference_mode():
            error = real_frame_error(module.channels_last_forward(x, lengths), module(x, lengths))
        assert error < 1e-5, factor


_INTERPRETED_KERNELS = textwrap.dedent("""
    import torch
    from oasr.kernels.subsampling import (first_conv_depthwise, first_conv_depthwise_reference, relu_depthwise,
                                          relu_depthwise_reference, supported)

    def relative_error(got, want):  # in units of the output's rounding: float32 1e-6, half precision 2 epsilon
        assert got.dtype == want.dtype and got.shape == want.shape
        unit = 1e-6 if want.dtype == torch.float32 else 2 * torch.finfo(want.dtype).eps
        return (got.float() - want.float()).abs().max().item() / (unit * max(want.float().abs().max().item(), 1.0))

    torch.manual_seed(0)
    worst = 0.0
    # Output positions not a multiple of the 32-position tile, channels not a multiple of the 128-channel tile,
    # odd frequency counts, rows of length 0 and 1, a larger kernel and stride; every output position compared
    # (both define padded frames as zero).
    for b, t, f, c, k, s, dtype in [(4, 21, 9, 8, 3, 2, torch.float32), (3, 13, 7, 136, 3, 2, torch.float32),
                                    (2, 17, 11, 5, 5, 3, torch.float32), (3, 19, 9, 8, 3, 2, torch.float16)]:
        lengths = torch.tensor([t, 1, 0, t - 6][:b])
        x = torch.randn(b, t, f).to(dtype)  # not zero past the lengths: both must read zeros there
        w1, b1, w2, b2 = torch.randn(k, k, c), torch.randn(c), torch.randn(k, k, c), torch.randn(c)
        assert supported(x)
        got = first_conv_depthwise(x, lengths, w1, b1, w2, b2, s)
        want = first_conv_depthwise_reference(x, lengths, w1, b1, w2, b2, s)
        worst = max(worst, relative_error(got, want))
        # The depthwise stage reads padding that is not zero (a pointwise conv's bias) and negative values.
        y = torch.randn(b, t, f, c).to(dtype)
        got = relu_depthwise(y, lengths, w2, b2, s)
        want = relu_depthwise_reference(y, lengths, w2, b2, s)
        worst = max(worst, relative_error(got, want))
    print(worst)
""")


def test_subsampling_kernels_equal_their_references_in_the_interpreter() -> None:
    assert worst_error_interpreted(_INTERPRETED_KERNELS) < 1.0


_INTERPRETED_MODULE = textwrap.dedent("""
    import torch
    from oasr.models.fastconformer.config import FastConformerEncoderConfig
    from oasr.models.fastconformer.encoder import ConvSubsampling, frame_mask
    torch.manual_seed(0)
    worst = 0.0
    for mels, channels, factor, t in [(17, 12, 8, 37), (9, 8, 4, 13), (11, 8, 16, 40)]:
        config = FastConformerEncoderConfig(hidden_size=16, num_attention_heads=4, subsampling_conv_channels=channels,
                                            num_mel_bins=mels, subsampling_factor=factor)
        module = ConvSubsampling(config).eval()
        lengths = torch.tensor([t, 1, 0, t // 2 + 1])
        x = torch.randn(4, t, mels) * frame_mask(lengths, t)[..., None]
        with torch.inference_mode():
            want, want_lengths = module(x, lengths)
            module.use_kernel = True
            got, got_lengths = module(x, lengths)
        assert torch.equal(got_lengths, want_lengths) and got.shape == want.shape
        real = frame_mask(want_lengths, want.shape[1])
        worst = max(worst, (got - want)[real].abs().max().item())
    print(worst)
""")


def test_subsampling_kernel_path_equals_the_torch_path_in_the_interpreter() -> None:
    assert worst_error_interpreted(_INTERPRETED_MODULE) < 1e-5


def test_kernel_weights_follow_writes_to_the_convolutions() -> None:
    module = subsampling_module()
    taps, bias = module.kernel_weights()[1]
    linear = module.frequency_major_linear_weight().clone()
    with torch.no_grad():
        module.layers[2].weight.mul_(2.0)
        module.linear.weight.add_(1.0)
    new_taps, new_bias = module.kernel_weights()[1]
    assert torch.equal(new_taps, 2.0 * taps) and torch.equal(new_bias, bias)
    assert torch.equal(module.frequency_major_linear_weight(), linear + 1.0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_subsampling_kernel_path_equals_the_torch_path_on_cuda(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    module = subsampling_module(mels=80, channels=256, hidden=1024).cuda()
    x, lengths = padded_features([1000, 1, 0, 617], 1000, 80, device="cuda")
    # Float32 convolutions on cuDNN may use TF32; the comparison needs the float32 they are written as.
    with torch.inference_mode(), torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        exact = module(x, lengths)
        module.to(dtype)
        torch_path = module(x.to(dtype), lengths)
        module.use_kernel = True
        kernel_path = module(x.to(dtype), lengths)
    assert kernel_path[0].dtype == dtype
    if dtype == torch.float32:
        assert real_frame_error(kernel_path, exact) < 1e-4
    else:  # about as far from float32 as torch's own half-precision path (which rounds more intermediates)
        assert real_frame_error(kernel_path, exact) <= 2 * real_frame_error(torch_path, exact)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_subsampling_kernels_equal_their_references_on_cuda(dtype: torch.dtype) -> None:
    from oasr.kernels.subsampling import (
        first_conv_depthwise,
        first_conv_depthwise_reference,
        relu_depthwise,
        relu_depthwise_reference,
    )

    torch.manual_seed(0)
    x, lengths = padded_features([1000, 1, 0, 617], 1000, 80, device="cuda")
    x = x.to(dtype)
    c = 256
    w1, b1 = torch.randn(3, 3, c, device="cuda") * 0.3, torch.randn(c, device="cuda") * 0.1
    w2, b2 = torch.randn(3, 3, c, device="cuda") * 0.3, torch.randn(c, device="cuda") * 0.1
    y = torch.randn(4, 250, 20, c, device="cuda", dtype=dtype)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        pairs = [
            (first_conv_depthwise(x, lengths, w1, b1, w2, b2, 2),
             first_conv_depthwise_reference(x, lengths, w1, b1, w2, b2, 2)),
            (relu_depthwise(y, lengths // 4, w2, b2, 2), relu_depthwise_reference(y, lengths // 4, w2, b2, 2)),
        ]
    for got, want in pairs:
        assert got.dtype == dtype
        # both accumulate in float32 (cuDNN's algorithms in their own order); half precision may then round
        # either way
        unit = 1e-5 if dtype == torch.float32 else 2 * torch.finfo(dtype).eps
        tolerance = unit * max(want.float().abs().max().item(), 1.0)
        assert (got.float() - want.float()).abs().max().item() < tolerance
