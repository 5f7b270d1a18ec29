"""Several GEMMs over one activation (``oasr.layers.SharedInput``): the same numbers as each layer alone, and one
quantization of the activation per way of quantizing it instead of one per quantized layer."""

from __future__ import annotations

import pytest
import torch

from oasr.layers import (
    GELU,
    GroupedQueryAttention,
    Linear,
    RelPositionMultiHeadAttention,
    RotaryEmbedding,
    SharedInput,
    SiLU,
    relative_position_embeddings,
)
from oasr.layers.cache import FullContext
from oasr.models import ARCHITECTURES
from oasr.quantization import QUANT_METHODS
from oasr.quantization.apply import method_named, quantizable, quantize_weights
from oasr.quantization.method import QuantMethod
from test_kernels import worst_error_interpreted


def _quantized(layer: Linear, name: str | None) -> Linear:
    if name is not None:
        method = method_named(name)
        weight, scale = method.quantize_weight(layer.weight)
        layer.set_quantized(method.bind(torch.device("cpu"), tuple(weight.shape)), weight, scale)
    return layer


@pytest.fixture
def quantizations(monkeypatch) -> list[str]:
    """The method of every activation quantization made from here on."""
    calls: list[str] = []
    original = QuantMethod.quantize_for

    def counted(self, lane, x, act=None):
        calls.append(self.name)
        return original(self, lane, x, act)

    monkeypatch.setattr(QuantMethod, "quantize_for", counted)
    return calls


def test_layers_quantized_alike_share_one_quantization_and_keep_their_numbers(quantizations) -> None:
    """Float, fp8 and int8 layers over one input: each output is the layer's own, and each method quantizes the
    input once, however many of its layers read it."""
    torch.manual_seed(0)
    layers = [_quantized(Linear(48, n, bias=n != 32), name)
              for n, name in ((48, "fp8"), (32, "int8"), (80, None), (16, "fp8"), (24, "int8"))]
    x = torch.randn(2, 7, 48)
    x[..., 3] *= 20  # an outlier channel: every row's scale differs
    with torch.inference_mode():
        alone = [layer(x) for layer in layers]
        quantizations.clear()
        shared = SharedInput(x)
        for layer, want in zip(layers, alone, strict=True):
            out = shared(layer)
            assert out.shape == (2, 7, layer.out_features)
            assert torch.equal(out, want)
    assert sorted(quantizations) == ["fp8", "int8"]


@pytest.mark.parametrize("name", QUANT_METHODS.names())
def test_whisper_quantizes_each_shared_activation_once(name: str, quantizations) -> None:
    """Teacher-forced tiny Whisper, every GEMM quantized: per encoder layer one quantization for q/k/v, one each
    for out_proj, fc1 and fc2; one for every decoder layer's cross-attention keys and values together; per
    decoder layer one for self-attention q/k/v and one each for its other four GEMMs."""
    arch = ARCHITECTURES.get("whisper")
    config = arch.tiny_config()
    model = arch.from_config(config).eval()
    quantize_weights(model, method_named(name), tuple(quantizable(model)))
    with torch.inference_mode():
        model(*arch.example_inputs(config, batch_size=2))
    assert len(quantizations) == 4 * config.encoder_layers + 1 + 6 * config.decoder_layers


@pytest.mark.parametrize("into", ["buffers", "callables"])
def test_cross_kv_into_quantizes_the_encoder_output_once(into: str, quantizations) -> None:
    """The engine's path for cross-attention K/V: every decoder layer's keys and values from one quantization,
    with the values each layer's own projections give."""
    arch = ARCHITECTURES.get("whisper")
    config = arch.tiny_config()
    model = arch.from_config(config).eval()
    quantize_weights(model, method_named("fp8"), tuple(quantizable(model)))
    hidden = torch.randn(2, 30, config.d_model)
    layers, d = config.decoder_layers, config.d_model
    k, v = torch.empty(layers, 2, 30, d), torch.empty(layers, 2, 30, d)
    with torch.inference_mode():
        quantizations.clear()
        if into == "buffers":
            model.cross_kv_into(hidden, k, v)
        else:
            model.cross_kv_into(hidden, [k[i].view(-1, d).copy_ for i in range(layers)],
                                [v[i].view(-1, d).copy_ for i in range(layers)])
        assert len(quantizations) == 1
        for i, layer in enumerate(model.model.decoder.layers):
            assert torch.equal(k[i], layer.encoder_attn.k_proj(hidden))
            assert torch.equal(v[i], layer.encoder_attn.v_proj(hidden))


def test_attention_variants_share_one_quantization_for_q_k_v(quantizations) -> None:
    """Relative-position attention (Conformers) and grouped-query attention (Qwen3's language model): q, k and v
    from one quantization, then one for each other projection."""
    torch.manual_seed(0)
    rel = RelPositionMultiHeadAttention(32, 4)
    grouped = GroupedQueryAttention(32, 4, 2, 8, qk_norm_eps=1e-6)
    for module in (rel, grouped):
        for layer in quantizable(module).values():
            _quantized(layer, "fp8")
    x = torch.randn(2, 6, 32)
    with torch.inference_mode():
        quantizations.clear()
        rel(x, relative_position_embeddings(6, 32, device=x.device, dtype=x.dtype))
        assert len(quantizations) == 3  # q/k/v, the distances' projection, o_proj
        quantizations.clear()
        positions = torch.arange(6).expand(2, -1)
        grouped.forward_cached(x, RotaryEmbedding(8)(positions), FullContext(), 0)
        assert len(quantizations) == 2  # q/k/v, o_proj


def test_gated_mlp_shares_its_input_between_gate_and_up(quantizations) -> None:
    arch = ARCHITECTURES.get("qwen3_asr")
    model = arch.from_config(arch.tiny_config()).eval()
    mlp = next(m for m in model.modules() if type(m).__name__ == "GatedMLP")
    quantize_weights(model, method_named("fp8"), tuple(quantizable(model)))
    with torch.inference_mode():
        mlp(torch.randn(2, 5, mlp.gate_proj.in_features))
    assert len(quantizations) == 2  # gate and up together, then down


@pytest.mark.parametrize("name", [None, *QUANT_METHODS.names()])
@pytest.mark.parametrize("act", [GELU(), SiLU()])
def test_after_is_the_activation_then_the_layer(name: str | None, act) -> None:
    """``Linear.after(act, x)`` (an MLP's second GEMM) is ``layer(act(x))``."""
    torch.manual_seed(1)
    layer = _quantized(Linear(64, 24), name)
    x = 3 * torch.randn(2, 5, 64)
    with torch.inference_mode():
        assert torch.equal(layer.after(act, x), layer(act(x)))
        assert not torch.equal(layer.after(act, x), layer(x))


def test_device_lanes_quantize_an_activation_with_the_kernel_in_the_interpreter() -> None:
    """After an activation, the device lanes' quantization (the Triton kernel, run here by Triton's interpreter)
    equals the reference lane's, bit for bit."""
    script = """
import torch
from oasr.layers import GELU
from oasr.quantization.apply import method_named
torch.manual_seed(0)
wrong = 0
for name, lane in (("fp8", "scaled_mm"), ("int8", "int_mm")):
    method = method_named(name)
    for dtype in (torch.float32, torch.float16):
        x = (3 * torch.randn(9, 640)).to(dtype)
        q, s = method.quantize_for(lane, x, GELU())
        want_q, want_s = method.quantize_for("reference", x, GELU())
        wrong += int((q.float() != want_q.float()).sum()) + int((s != want_s).sum())
        wrong += int(torch.equal(q.float(), method.quantize_for("reference", x)[0].float()))  # GELU was applied
print(wrong)
"""
    assert worst_error_interpreted(script) == 0
