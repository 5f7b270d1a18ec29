"""Triton kernels against their torch references: on CPU through Triton's interpreter (each in a subprocess, as
the interpreter is chosen when kernels are defined), on CUDA natively (marked gpu)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from oasr.kernels.conformer_conv import (
    fold_batch_norm,
    glu_depthwise_conv,
    glu_depthwise_conv_reference,
)
from oasr.layers import apply_backend
from oasr.layers.frames import FrameLayout
from oasr.models import ARCHITECTURES
from oasr.models.fastconformer.config import FastConformerEncoderConfig
from oasr.models.fastconformer.encoder import (
    ConvolutionModule,
    ConvSubsampling,
)

pytest.importorskip("triton")


def conv_module(channels: int = 48, kernel: int = 9, act: str = "silu", seed: int = 0) -> ConvolutionModule:
    """A convolution module whose batch norm has non-trivial statistics, so folding it is tested."""
    torch.manual_seed(seed)
    config = FastConformerEncoderConfig(hidden_size=channels, num_attention_heads=4, conv_kernel_size=kernel,
                                        hidden_act=act)
    module = ConvolutionModule(config).eval()
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0.0, 0.3)
        module.norm.running_mean.normal_(0.0, 0.5)
        module.norm.running_var.uniform_(0.5, 2.0)
    return module


@pytest.mark.parametrize("act", ["silu", "relu"])
def test_folded_reference_equals_the_module_in_torch(act: str) -> None:
    module = conv_module(act=act)
    lengths = torch.tensor([23, 9, 1])
    x = torch.randn(3, 23, 48)
    frames = FrameLayout.padded(lengths, 23)
    with torch.inference_mode():
        expected = module(x, frames)  # the plain torch path: GLU, mask, conv, batch norm, activation
        y = module.pointwise_conv1(x)
        got = module.pointwise_conv2(glu_depthwise_conv_reference(y, frames, *module.folded(), act))
    real = frames.mask[:, :, None].expand_as(expected)
    assert torch.allclose(got[real], expected[real], atol=1e-5, rtol=1e-5)


def test_folded_weights_follow_writes_to_the_batch_norm() -> None:
    module = conv_module()
    before = [t.clone() for t in module.folded()]
    with torch.no_grad():
        module.norm.running_var.mul_(4.0)
    after = module.folded()
    assert not torch.allclose(before[0], after[0])
    assert torch.allclose(after[0], fold_batch_norm(module.depthwise_conv.weight, module.depthwise_conv.bias,
                                                    module.norm)[0])


_INTERPRETED = textwrap.dedent("""
    import torch
    from oasr.kernels.conformer_conv import glu_depthwise_conv, glu_depthwise_conv_reference, supported
    from oasr.layers.frames import FrameLayout
    torch.manual_seed(0)
    worst = 0.0
    # Frames not a multiple of the kernel's 16-frame tile, channels not a multiple of its 128, an empty row.
    for b, t, c, k, act in [(3, 37, 160, 9, "silu"), (2, 5, 24, 3, "relu"), (1, 16, 128, 31, "identity")]:
        y = torch.randn(b, t, 2 * c)
        lengths = torch.tensor([t, max(t // 2, 1), 0][:b])
        frames = FrameLayout.padded(lengths, t)
        w, bias = torch.randn(c, k), torch.randn(c)
        assert supported(y, act)
        got = glu_depthwise_conv(y, frames, w, bias, act)
        want = glu_depthwise_conv_reference(y, frames, w, bias, act)
        worst = max(worst, (got - want).abs().max().item())
        # Packed (no empty rows; later utterances start off the padded grid): each utterance's frames read and
        # written where the layout puts them.
        lengths = torch.tensor([t, max(t // 3, 1), max(t // 2, 1)][:b])
        padded = FrameLayout.padded(lengths, t)
        want = glu_depthwise_conv_reference(y, padded, w, bias, act)[padded.mask]
        packed = FrameLayout.packed(lengths.tolist(), t, "cpu")
        rows = packed.pack(y)
        used = int(lengths.sum())
        got = glu_depthwise_conv(rows, packed, w, bias, act)[:used]
        worst = max(worst, (got - want).abs().max().item())
        worst = max(worst, (glu_depthwise_conv_reference(rows, packed, w, bias, act)[:used] - want).abs().max().item())
    print(worst)
""")


def worst_error_interpreted(script: str) -> float:
    """Runs ``script`` under Triton's interpreter in a fresh process; -> the error it prints last."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return float(done.stdout.strip().splitlines()[-1])


def test_glu_depthwise_conv_kernel_equals_its_reference_in_the_interpreter() -> None:
    assert worst_error_interpreted(_INTERPRETED) < 1e-5


@pytest.mark.parametrize(("module_type", "covered", "still_gaps"), [
    # The feed-forward's activation and the GLU before the convolution kernel are still torch's.
    (ConvolutionModule, {"batch_norm"}, {"rel_pos_attention", "silu", "glu"}),
    # The pointwise convs and the output projection stay cuBLAS matrix multiplies.
    (ConvSubsampling, {"conv2d", "relu"}, {"linear"}),
])
def test_kernels_backend_switches_a_module_and_counts_what_its_kernel_absorbs_as_covered(
    module_type: type, covered: set[str], still_gaps: set[str]
) -> None:
    arch = ARCHITECTURES.get("parakeet_ctc")
    model = arch.from_config(arch.tiny_config())
    modules = [m for m in model.modules() if isinstance(m, module_type)]
    gaps = {g.op for g in apply_backend(model, "kernels")}
    assert modules and all(m.use_kernel for m in modules)
    assert not covered & gaps
    assert still_gaps <= gaps
    apply_backend(model, "torch")
    assert not any(m.use_kernel for m in modules)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_glu_depthwise_conv_kernel_equals_its_reference_on_cuda(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    b, t, c, k = 8, 203, 1024, 9
    y = torch.randn(b, t, 2 * c, device="cuda", dtype=dtype)
    lengths = torch.randint(1, t + 1, (b,), device="cuda")
    frames = FrameLayout.padded(lengths, t)
    w, bias = torch.randn(c, k, device="cuda") * 0.2, torch.randn(c, device="cuda")
    got = glu_depthwise_conv(y, frames, w, bias, "silu")
    want = glu_depthwise_conv_reference(y, frames, w, bias, "silu")
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    assert got.dtype == dtype and (got.float() - want.float()).abs().max().item() < tolerance
    packed = FrameLayout.packed(lengths.tolist(), t, "cuda")
    used = int(lengths.sum())
    got = glu_depthwise_conv(packed.pack(y), packed, w, bias, "silu")[:used]
    assert (got.float() - want[frames.mask].float()).abs().max().item() < tolerance


def test_a_module_made_under_inference_mode_folds_its_batch_norm() -> None:
    with torch.inference_mode():  # parameters are inference tensors, which keep no write count
        module = conv_module()
        weight, _ = module.folded()
        assert torch.equal(weight, fold_batch_norm(module.depthwise_conv.weight, module.depthwise_conv.bias,
                                                   module.norm)[0])


_INTERPRETED_NORM = textwrap.dedent("""
    import torch
    from oasr.kernels.layer_norm import add_layer_norm, add_layer_norm_reference, supported
    torch.manual_seed(0)
    worst = 0.0
    # A width that is not a power of two, with and without the residual, weight and bias.
    for rows, dim, residual, affine, alpha in [(7, 96, True, True, 0.5), (3, 80, False, True, 1.0), (5, 64, True, False, 1.0)]:
        x = torch.randn(rows, dim) * 3 + 1
        delta = torch.randn(rows, dim) if residual else None
        w, b = (torch.randn(dim), torch.randn(dim)) if affine else (None, None)
        assert supported(x)
        got = add_layer_norm(x, delta, w, b, 1e-5, alpha)
        want = add_layer_norm_reference(x, delta, w, b, 1e-5, alpha)
        worst = max(worst, *((g - r).abs().max().item() for g, r in zip(got, want)))
    print(worst)
""")


def test_add_layer_norm_kernel_equals_its_reference_in_the_interpreter() -> None:
    assert worst_error_interpreted(_INTERPRETED_NORM) < 1e-5


def test_layer_norm_add_forward_is_the_residual_then_the_norm() -> None:
    from oasr.layers import LayerNorm

    norm = LayerNorm(32)
    with torch.no_grad():
        norm.weight.normal_()
        norm.bias.normal_()
    x, delta = torch.randn(4, 5, 32), torch.randn(4, 5, 32)
    total, normed = norm.add_forward(x, delta, alpha=0.5)
    assert torch.equal(total, x + 0.5 * delta)
    assert torch.allclose(normed, norm(x + 0.5 * delta))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_add_layer_norm_kernel_equals_its_reference_on_cuda(dtype: torch.dtype) -> None:
    from oasr.kernels.layer_norm import add_layer_norm, add_layer_norm_reference

    torch.manual_seed(0)
    x = torch.randn(333, 1280, device="cuda", dtype=dtype)
    delta = torch.randn_like(x)
    w, b = torch.randn(1280, device="cuda", dtype=dtype), torch.randn(1280, device="cuda", dtype=dtype)
    got = add_layer_norm(x, delta, w, b, 1e-5, 0.5)
    want = add_layer_norm_reference(x, delta, w, b, 1e-5, 0.5)
    tolerance = 1e-4 if dtype == torch.float32 else 2e-2
    assert torch.equal(got[0], want[0])
    assert (got[1].float() - want[1].float()).abs().max().item() < tolerance
