"""Several GEMMs over one activation (``oasr.layers.SharedInput``): the same numbers as each layer alone, and one
quantization of the activation per method instead of one per quantized layer."""

from __future__ import annotations

import pytest
import torch

from oasr.layers import GELU, Linear, SharedInput, SiLU
from oasr.models import ARCHITECTURES
from oasr.quantization import QUANT_METHODS
from oasr.quantization.apply import method_named, quantizable, quantize_weights
from oasr.quantization.method import QuantMethod


@pytest.mark.parametrize("name", [None, *QUANT_METHODS.names()])
def test_shared_input_equals_each_layer_alone(name: str | None) -> None:
    torch.manual_seed(0)
    layers = [Linear(48, n, bias=n != 32) for n in (48, 32, 80)]
    if name is not None:
        for layer in layers:
            weight, scale = method_named(name).quantize_weight(layer.weight)
            layer.set_quantized(method_named(name).bind(torch.device("cpu"), tuple(weight.shape)), weight, scale)
    x = torch.randn(2, 7, 48)
    x[..., 3] *= 20  # an outlier channel: every row's scale differs
    shared = SharedInput(x)
    with torch.inference_mode():
        for layer in layers:
            out = shared(layer)
            assert out.shape == (2, 7, layer.out_features)
            assert torch.equal(out, layer(x))


def _count_quantizations(monkeypatch) -> list[int]:
    calls = [0]
    original = QuantMethod.quantize_for

    def counted(self, lane, x, act=None):
        calls[0] += 1
        return original(self, lane, x, act)

    monkeypatch.setattr(QuantMethod, "quantize_for", counted)
    return calls


@pytest.mark.parametrize("name", QUANT_METHODS.names())
def test_whisper_quantizes_each_shared_activation_once(name: str, monkeypatch) -> None:
    """Teacher-forced tiny Whisper, every GEMM quantized: per encoder layer one quantization for q/k/v, one each
    for out_proj, fc1 and fc2; one for every decoder layer's cross-attention keys and values together; per
    decoder layer one for self-attention q/k/v and one each for its other four GEMMs."""
    arch = ARCHITECTURES.get("whisper")
    config = arch.tiny_config()
    model = arch.from_config(config).eval()
    quantize_weights(model, method_named(name), tuple(quantizable(model)))
    calls = _count_quantizations(monkeypatch)
    with torch.inference_mode():
        model(*arch.example_inputs(config, batch_size=2))
    assert calls[0] == 4 * config.encoder_layers + 1 + 6 * config.decoder_layers


def test_grouped_attention_and_gated_mlp_share_their_input(monkeypatch) -> None:
    """Qwen3-ASR's language model: q/k/v share one quantization, and so do the MLP's gate and up projections."""
    arch = ARCHITECTURES.get("qwen3_asr")
    model = arch.from_config(arch.tiny_config()).eval()
    mlp = next(m for m in model.modules() if type(m).__name__ == "GatedMLP")
    quantize_weights(model, method_named("fp8"), tuple(quantizable(model)))
    calls = _count_quantizations(monkeypatch)
    with torch.inference_mode():
        mlp(torch.randn(2, 5, mlp.gate_proj.in_features))
    assert calls[0] == 2  # gate and up together, then down


@pytest.mark.parametrize("name", [None, *QUANT_METHODS.names()])
@pytest.mark.parametrize("act", [GELU(), SiLU()])
def test_after_is_the_activation_then_the_layer(name: str | None, act) -> None:
    """``Linear.after(act, x)`` (an MLP's second GEMM, which a quantized lane may fold GELU into) is
    ``layer(act(x))``."""
    torch.manual_seed(1)
    layer = Linear(64, 24)
    if name is not None:
        weight, scale = method_named(name).quantize_weight(layer.weight)
        layer.set_quantized(method_named(name).bind(torch.device("cpu"), tuple(weight.shape)), weight, scale)
    x = 3 * torch.randn(2, 5, 64)
    with torch.inference_mode():
        assert torch.equal(layer.after(act, x), layer(act(x)))
        assert not torch.equal(layer.after(act, x), layer(x))
