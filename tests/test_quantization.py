"""Quantization at the layer waist: each method's GEMM against dequantize-and-multiply, SmoothQuant's folding
invariant, the native checkpoint round trip, refusals, and int8 tiny.en's WER on the shared English clips."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from oasr.api import from_pretrained  # the public one: it hands the loader the calibration feed
from oasr.audio import load_audio
from oasr.bench.wer import word_error_rate
from oasr.cli import main
from oasr.errors import CheckpointError, UnsupportedQuantizationError
from oasr.models import ARCHITECTURES
from oasr.quantization import QUANT_METHODS, QuantizationSpec
from oasr.quantization.apply import (
    check_serves,
    default_calibration,
    method_named,
    quantizable,
    quantize_weights,
    quantized_modules,
)
from oasr.quantization.smooth import activation_ranges, expand_groups, smooth
from oasr.transcription.offline import calibration_feed
from speech_data import audio_path, english_short, require_speech_data

# The first English clips of the shared set (manifest order): enough words for a WER, few enough to stay fast.
WER_CLIPS = 12
SAMPLE = Path(__file__).resolve().parents[1] / "oasr" / "assets" / "jfk.flac"


def fake_quant_per_token(x: torch.Tensor, method: str) -> torch.Tensor:
    """What each method's kernels see of an activation, written out independently of the package."""
    if method == "fp8":
        scale = x.abs().amax(1, keepdim=True) / 448.0
        return (x / scale).to(torch.float8_e4m3fn).float() * scale
    scale = x.abs().amax(1, keepdim=True) / 127.0
    return (x / scale).round().clamp(-127, 127) * scale


@pytest.mark.parametrize("name", QUANT_METHODS.names())
def test_each_method_gemm_equals_dequantize_and_matmul(name: str) -> None:
    torch.manual_seed(0)
    method = method_named(name)
    x, w, bias = torch.randn(37, 96), torch.randn(80, 96) * 0.05, torch.randn(80)
    x[:, 5] *= 30  # an outlier channel, as speech models have
    q, scale = method.quantize_weight(w)
    assert q.dtype == method.storage_dtype and scale.dtype == torch.float32 and scale.shape == (80,)
    dequantized = q.float() * scale[:, None]
    # Per-channel scales: each output row is its own range (max error half a step for int8, 1/16 relative fp8).
    step = w.abs().amax(1, keepdim=True) / method.qmax
    assert ((dequantized - w).abs() <= (0.5 * step if name == "int8" else w.abs() / 16 + 1e-9)).all()
    expected = fake_quant_per_token(x, name) @ dequantized.t() + bias
    lane = method.bind(torch.device("cpu"), tuple(w.shape)).lane
    out = method.run(lane, x, q, scale, bias)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-4)
    # Half-precision activations come back in their own dtype.
    assert method.run(lane, x.to(torch.bfloat16), q, scale, bias.to(torch.bfloat16)).dtype == torch.bfloat16


def test_int8_int_mm_lane_equals_the_reference() -> None:
    """CUDA's int8 lane (torch._int_mm, exact int32 sums) runs on the CPU too: the same numbers as the oracle."""
    torch.manual_seed(1)
    method = method_named("int8")
    x, w, bias = torch.randn(5, 64), torch.randn(24, 64), torch.randn(24)
    q, scale = method.quantize_weight(w)
    torch.testing.assert_close(method.run("int_mm", x, q, scale, bias), method.reference(x, q, scale, bias),
                               rtol=1e-6, atol=1e-5)


def test_fp8_scaled_mm_lane_equals_the_reference_where_torch_runs_it_on_the_cpu() -> None:
    """The call CUDA makes (row-wise scale_a [M, 1], scale_b [1, N], float32, out_dtype), checked where this torch
    build also runs it on the CPU (2.13 does)."""
    torch.manual_seed(2)
    method = method_named("fp8")
    x, w, bias = torch.randn(32, 64), torch.randn(48, 64), torch.randn(48)
    q, scale = method.quantize_weight(w)
    try:
        fast = method.run("scaled_mm", x, q, scale, bias)
    except (RuntimeError, NotImplementedError) as exc:
        pytest.skip(f"torch {torch.__version__} has no CPU _scaled_mm: {exc}")
    torch.testing.assert_close(fast, method.reference(x, q, scale, bias), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("name", QUANT_METHODS.names())
def test_quantized_storage_follows_the_device_never_the_dtype(name: str) -> None:
    arch = ARCHITECTURES.get("whisper")
    model = arch.from_config(arch.tiny_config()).eval()
    quantize_weights(model, method_named(name), tuple(quantizable(model)))
    model = model.to(torch.bfloat16)
    fc1 = model.model.encoder.layers[0].fc1
    assert fc1.weight.dtype == method_named(name).storage_dtype and fc1.weight_scale.dtype == torch.float32
    assert fc1.bias.dtype == torch.bfloat16 and fc1.compute_dtype == torch.bfloat16
    assert model.proj_out.weight.dtype == torch.bfloat16  # the vocabulary head is never quantized
    with torch.inference_mode():
        assert fc1(torch.randn(3, 64, dtype=torch.bfloat16)).dtype == torch.bfloat16


@pytest.mark.parametrize("arch_name", ARCHITECTURES.names())
@pytest.mark.parametrize("name", QUANT_METHODS.names())
def test_every_architecture_runs_quantized_close_to_float(arch_name: str, name: str) -> None:
    torch.manual_seed(0)
    arch = ARCHITECTURES.get(arch_name)
    config = arch.tiny_config()
    model = arch.from_config(config).eval()
    inputs = arch.example_inputs(config, batch_size=2)
    for group in arch.capabilities.smooth_groups:  # a declaration must name real modules of the tiny model
        assert group.expand({n for n, _ in model.named_modules()})
    if arch.capabilities.decode_step_gemms:  # so must this one (matching raises on a pattern matching nothing)
        assert len(quantized_modules(model)) < len(quantizable(model))
    with torch.inference_mode():
        expected = model(*inputs)
        layers = quantizable(model)
        assert layers, f"{arch_name} has no quantizable GEMM"
        quantize_weights(model, method_named(name), tuple(layers))
        out = model(*inputs)
    assert torch.isfinite(out).all()
    assert (out - expected).norm() < 0.2 * expected.norm(), arch_name


def test_smoothing_leaves_the_float_model_unchanged(tiny_en_fresh) -> None:
    """Folding is exact in real arithmetic: the float32 model's logits stay put, while its weights move."""
    loaded = tiny_en_fresh
    model = loaded.model
    features = loaded.features([load_audio(SAMPLE)])
    tokens = torch.tensor([[50257, 50362, 843, 523]])
    with torch.inference_mode():
        before = model(features, tokens)
    fc1_before = model.model.encoder.layers[1].fc1.weight.clone()
    groups = expand_groups(model, type(model).capabilities.smooth_groups)
    assert len(groups) == 4 * 2 + 4 * 3 + 1
    smoothing = smooth(model, groups, activation_ranges(loaded, groups, default_calibration(), calibration_feed), 0.5, "test")
    assert smoothing.groups == groups
    assert not torch.allclose(model.model.encoder.layers[1].fc1.weight, fc1_before, rtol=0.05)
    with torch.inference_mode():
        after = model(features, tokens)
    torch.testing.assert_close(after, before, rtol=1e-4, atol=2e-4)


@pytest.fixture
def tiny_en_fresh():
    return from_pretrained("tiny.en", device="cpu", dtype="float32", backend="torch")


@pytest.fixture(scope="module")
def int8_dir(tmp_path_factory) -> Path:
    destination = tmp_path_factory.mktemp("quant") / "tiny.en-int8"
    assert main(["quantize", "tiny.en", str(destination), "--method", "int8"]) == 0
    return destination


def test_quantized_checkpoint_round_trips_its_spec_and_bytes(int8_dir: Path) -> None:
    manifest = json.loads((int8_dir / "oasr.json").read_text())
    assert manifest["format_version"] == 2
    spec = QuantizationSpec.from_dict(manifest["quantization"])
    assert spec.method == "int8" and spec.smoothing is not None and "jfk.flac" in spec.smoothing.calibration
    assert "model.encoder.layers.3.fc2" in spec.modules and "proj_out" not in spec.modules
    # Decode steps keep their float GEMMs by default; the cross-attention keys and values (1,500 rows) do not.
    assert not {"model.decoder.layers.3.fc2", "model.decoder.layers.0.self_attn.q_proj"} & set(spec.modules)
    assert "model.decoder.layers.3.encoder_attn.k_proj" in spec.modules
    assert "model.decoder.layers.0.final_layer_norm" not in {g.norm for g in spec.smoothing.groups}
    assert QuantizationSpec.from_dict(spec.to_dict()) == spec
    stored = load_file(str(int8_dir / "model.safetensors"))
    loaded = from_pretrained(int8_dir, device="cpu", dtype="float32", keep_checkpoint=True)  # no flag needed
    assert loaded.checkpoint.quantization == spec
    state = loaded.model.state_dict()
    for name in spec.modules:
        assert stored[f"{name}.weight"].dtype == torch.int8 and stored[f"{name}.weight_scale"].dtype == torch.float32
        assert torch.equal(state[f"{name}.weight"], stored[f"{name}.weight"])
        assert torch.equal(state[f"{name}.weight_scale"], stored[f"{name}.weight_scale"])
    # A quantized checkpoint is not quantized again.
    again = int8_dir.parent / "again"
    assert main(["quantize", str(int8_dir), str(again), "--method", "int8"]) == 2  # already quantized: refused
    assert not again.exists()


def test_decode_steps_flag_quantizes_every_gemm(tmp_path: Path) -> None:
    destination = tmp_path / "all"
    assert main(["quantize", "tiny.en", str(destination), "--method", "fp8", "--decode-steps"]) == 0
    spec = QuantizationSpec.from_dict(json.loads((destination / "oasr.json").read_text())["quantization"])
    model = from_pretrained("tiny.en", device="cpu", dtype="float32").model
    assert set(spec.modules) == set(quantizable(model)) and "model.decoder.layers.3.fc2" in spec.modules
    assert set(quantized_modules(model)) < set(spec.modules)


def test_quantizing_at_load_equals_the_default_quantized_checkpoint(int8_dir: Path) -> None:
    online = from_pretrained("tiny.en", device="cpu", dtype="float32", quantization="int8").model.state_dict()
    stored = load_file(str(int8_dir / "model.safetensors"))
    for key in ("model.encoder.layers.0.fc1.weight", "model.decoder.layers.2.encoder_attn.k_proj.weight_scale"):
        assert torch.equal(online[key], stored[key])


def test_fp8_round_trip_keeps_e4m3_bytes(tmp_path: Path) -> None:
    destination = tmp_path / "fp8"
    assert main(["quantize", "tiny.en", str(destination), "--method", "fp8"]) == 0
    spec = QuantizationSpec.from_dict(json.loads((destination / "oasr.json").read_text())["quantization"])
    assert spec.method == "fp8" and spec.smoothing is None
    stored = load_file(str(destination / "model.safetensors"))
    state = from_pretrained(destination, device="cpu", dtype="float16").model.state_dict()
    key = "model.encoder.layers.2.self_attn.v_proj.weight"
    assert stored[key].dtype == state[key].dtype == torch.float8_e4m3fn
    assert torch.equal(stored[key].view(torch.uint8), state[key].view(torch.uint8))


def test_calibration_manifest_sets_the_smoothing(int8_dir: Path, tmp_path: Path) -> None:
    manifest = tmp_path / "calibration.jsonl"
    manifest.write_text(json.dumps({"audio": str(SAMPLE)}) + "\n")
    destination = tmp_path / "calibrated"
    assert main(["quantize", "tiny.en", str(destination), "--method", "int8", "--calibration", str(manifest),
                 "--alpha", "0.8"]) == 0
    spec = QuantizationSpec.from_dict(json.loads((destination / "oasr.json").read_text())["quantization"])
    assert spec.smoothing.calibration == "calibration.jsonl (1 inputs)" and spec.smoothing.alpha == 0.8
    key = "model.encoder.layers.0.fc1.weight_scale"
    # The same audio with another alpha moves a different share of the range into the weights.
    assert not torch.equal(load_file(str(destination / "model.safetensors"))[key],
                           load_file(str(int8_dir / "model.safetensors"))[key])
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert main(["quantize", "tiny.en", str(tmp_path / "none"), "--method", "int8", "--calibration", str(empty)]) == 2


def _edited_copy(source: Path, destination: Path, edit) -> Path:
    destination.mkdir()
    for name in ("model.safetensors", "tokenizer.json"):
        (destination / name).symlink_to(source / name)
    manifest = json.loads((source / "oasr.json").read_text())
    edit(manifest["quantization"])
    (destination / "oasr.json").write_text(json.dumps(manifest))
    return destination


def test_a_spec_naming_a_missing_module_is_refused(int8_dir: Path, tmp_path: Path) -> None:
    bad = _edited_copy(int8_dir, tmp_path / "bad", lambda q: q["modules"].append("model.encoder.layers.9.fc1"))
    with pytest.raises(UnsupportedQuantizationError, match=r"model\.encoder\.layers\.9\.fc1"):
        from_pretrained(bad, device="cpu")


def test_an_unknown_method_is_refused(int8_dir: Path, tmp_path: Path) -> None:
    bad = _edited_copy(int8_dir, tmp_path / "int4", lambda q: q.update(method="int4"))
    with pytest.raises(UnsupportedQuantizationError, match="int4"):
        from_pretrained(bad, device="cpu")
    with pytest.raises(UnsupportedQuantizationError, match="unknown quantization method 'nf4'"):
        check_serves("nf4", torch.device("cpu"), torch.float32)
    broken = _edited_copy(int8_dir, tmp_path / "broken", lambda q: q.update(activation_scales="per_tensor"))
    with pytest.raises(CheckpointError, match="per_tensor"):
        from_pretrained(broken, device="cpu")


def test_another_method_on_a_quantized_checkpoint_is_refused(int8_dir: Path) -> None:
    with pytest.raises(UnsupportedQuantizationError, match="already quantized with int8"):
        from_pretrained(int8_dir, device="cpu", quantization="fp8")


def test_devices_and_dtypes_a_method_cannot_serve_are_refused(monkeypatch) -> None:
    import oasr.quantization.method as method

    cuda = torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    monkeypatch.setattr(method, "cuda_capability", lambda device: (8, 0))
    with pytest.raises(UnsupportedQuantizationError, match=r"'fp8' cannot serve device cuda: NVIDIA A100.*8\.0"):
        check_serves("fp8", cuda, torch.float16)
    monkeypatch.setattr(method, "cuda_capability", lambda device: (9, 0))
    check_serves("fp8", cuda, torch.float16)  # an H100 / H200 is served
    monkeypatch.delattr(torch, "_scaled_mm")
    with pytest.raises(UnsupportedQuantizationError, match="no torch._scaled_mm"):
        check_serves("fp8", cuda, torch.float16)
    monkeypatch.setattr(method, "cuda_capability", lambda device: (7, 0))
    with pytest.raises(UnsupportedQuantizationError, match=r"'int8' cannot serve device cuda.*7\.0"):
        check_serves("int8", cuda, torch.float16)
    with pytest.raises(UnsupportedQuantizationError, match="mps"):
        check_serves("int8", torch.device("mps"), torch.float16)
    with pytest.raises(UnsupportedQuantizationError, match="dtype float64"):
        check_serves("fp8", torch.device("cpu"), torch.float64)
    check_serves("fp8", torch.device("cpu"), torch.float32)  # the CPU is served by dequantizing


def _wer_of(capsys, model_args: list[str], manifest: Path, references: list[str]) -> float:
    capsys.readouterr()
    assert main(["transcribe", *model_args, "--device", "cpu", "--dtype", "float32", "--quiet",
                 "--output-format", "jsonl", "--manifest", str(manifest)]) == 0
    texts = [json.loads(line)["text"] for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert len(texts) == len(references)
    return word_error_rate(references, texts).wer


@pytest.mark.slow
def test_int8_tiny_en_wer_is_within_a_point_of_float32(int8_dir: Path, tmp_path: Path, capsys) -> None:
    require_speech_data()
    entries = english_short()[:WER_CLIPS]
    manifest = tmp_path / "clips.jsonl"
    manifest.write_text("".join(json.dumps({"audio": str(audio_path(e))}) + "\n" for e in entries))
    references = [e["text"] for e in entries]
    full = _wer_of(capsys, ["--model", "tiny.en"], manifest, references)
    quantized = _wer_of(capsys, ["--model", str(int8_dir)], manifest, references)
    print(f"\ntiny.en WER over {len(entries)} English clips: float32 {full:.4f}, int8 {quantized:.4f}")
    assert full < 0.25  # the clips are read speech: a broken frontend lands far above
    assert quantized <= full + 0.01


def test_bench_refuses_quantize_decode_steps_without_random_weights(capsys) -> None:
    assert main(["bench", "--model", "tiny.en", "--quantization", "fp8", "--quantize-decode-steps"]) == 2
    assert "--quantize-decode-steps needs --random-weights" in capsys.readouterr().err
