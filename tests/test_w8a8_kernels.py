"""The W8A8 kernels against their torch paths, under Triton's interpreter on CPU and natively on CUDA: the per-token
activation quantization bit for bit against ``QuantMethod.quantize_activation``, and the int32 rescaling against
``acc.float() * x_scale * w_scale + bias`` (to float32 rounding)."""

from __future__ import annotations

import textwrap

import pytest
import torch

from test_kernels import worst_error_interpreted

# Prints the number of (value or scale) elements that differ from the torch path, over every case.
_CASES = textwrap.dedent("""
    import torch
    from oasr.kernels.w8a8 import quantize_rows
    from oasr.quantization.apply import method_named

    def cases(device):
        torch.manual_seed(0)
        for rows, dim in [(5, 48), (3, 64), (2, 100), (1, 1280), (9, 1100)]:  # 1100: three chunks, masked tail
            for dtype in (torch.float32, torch.float16, torch.bfloat16):
                x = (4 * torch.randn(rows, dim, device=device)).to(dtype)
                x[0, :3] = torch.tensor([30.0, -0.001, 1e-30])  # an outlier, a tiny value, one that underflows
                yield x
        ties = torch.tensor([[127.0, 2.5, -3.5, 0.5, -0.5, 1.5, 126.5, -126.5]], device=device)  # scale 1
        yield ties
        yield torch.zeros(2, 16, device=device)  # all-zero rows: the floor scale, zero values

    def differing(device):
        wrong = 0
        for name in ("fp8", "int8"):
            method = method_named(name)
            for x in cases(device):
                q, scale = quantize_rows(x, method.storage_dtype, method.qmax)
                want_q, want_scale = method.quantize_activation(x)
                assert q.dtype == want_q.dtype and scale.shape == want_scale.shape == (x.shape[0], 1)
                wrong += int((q.float() != want_q.float()).sum()) + int((scale != want_scale).sum())
        return wrong

    def rescale_error(device):
        from oasr.kernels.w8a8 import dequantize_int32
        torch.manual_seed(1)
        worst = 0.0
        for m, n, extra in [(3, 40, 0), (17, 1100, 4), (5, 8, 0)]:  # extra: padded rows the GEMM computed
            acc = torch.randint(-2**20, 2**20, (m + extra, n), dtype=torch.int32, device=device)
            xs, ws = torch.rand(m, 1, device=device) / 100, torch.rand(n, device=device) / 100
            for bias in (None, torch.randn(n, device=device)):
                for dtype in (torch.float32, torch.float16, torch.bfloat16):
                    b = None if bias is None else bias.to(dtype)
                    got = dequantize_int32(acc, xs, ws, b, dtype)
                    want = acc[:m].float() * xs * ws + (0 if b is None else b.float())
                    assert got.dtype == dtype and got.shape == (m, n)
                    worst = max(worst, ((got.float() - want.to(dtype).float()).abs() / (want.abs() + 1)).max().item())
        return worst
""")


def test_quantize_rows_equals_the_torch_quantization_in_the_interpreter() -> None:
    assert worst_error_interpreted(_CASES + "\nprint(differing('cpu'))\n") == 0


def test_int32_rescaling_equals_the_torch_path_in_the_interpreter() -> None:
    assert worst_error_interpreted(_CASES + "\nprint(rescale_error('cpu'))\n") < 1e-2


@pytest.mark.gpu
def test_w8a8_kernels_equal_the_torch_paths_on_cuda() -> None:
    namespace: dict = {}
    exec(_CASES, namespace)  # noqa: S102 (the same cases as the interpreter's, natively)
    assert namespace["differing"](torch.device("cuda")) == 0
    assert namespace["rescale_error"](torch.device("cuda")) < 1e-2


@pytest.mark.gpu
def test_cuda_lanes_quantize_with_the_kernel(monkeypatch) -> None:
    """The fp8 and int8 CUDA lanes take their activation scales from the kernel (not the torch passes)."""
    from oasr.kernels import w8a8 as kernel
    from oasr.quantization.apply import method_named

    calls = []
    original = kernel.quantize_rows
    monkeypatch.setattr(kernel, "quantize_rows", lambda *a: calls.append(a[1]) or original(*a))
    for name in ("fp8", "int8"):
        method = method_named(name)
        w = torch.randn(256, 128, device="cuda")
        q, scale = method.quantize_weight(w)
        lane = method.bind(torch.device("cuda"), tuple(w.shape)).lane
        method.run(lane, torch.randn(40, 128, device="cuda").half(), q, scale, None)
    assert calls == [torch.float8_e4m3fn, torch.int8]


@pytest.mark.gpu
def test_quantized_linear_compiles_as_the_compiled_encoder_runs_it() -> None:
    """``--compile-encoder`` traces the quantized layers. After an activation (``Linear.after``) the kernel is
    launched under torch.compile (which passes float arguments as float64) and gives the eager numbers; a plain
    call's quantization is torch's ops there, whose division may put a value one step off."""
    from oasr.layers import GELU, Linear
    from oasr.quantization.apply import method_named

    torch.manual_seed(0)
    for name in ("fp8", "int8"):
        layer = Linear(256, 384).cuda().half()
        method = method_named(name)
        q, scale = method.quantize_weight(layer.weight)
        layer.set_quantized(method.bind(torch.device("cuda"), tuple(q.shape)), q, scale)
        x = torch.randn(2, 100, 256, device="cuda", dtype=torch.float16)
        act = GELU()
        with torch.inference_mode():
            eager, eager_after = layer(x), layer.after(act, x)
            torch._dynamo.reset()
            compiled = torch.compile(layer)(x)
            compiled_after = torch.compile(lambda h: layer.after(act, h))(x)
        torch.testing.assert_close(compiled_after, eager_after, rtol=2e-3, atol=2e-3)
        assert (compiled.float() - eager.float()).norm() < 1e-2 * eager.float().norm()
