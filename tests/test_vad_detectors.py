"""VAD detectors: Silero VAD against the silero-vad package's own model, batched and streaming; the energy
detector; the registry; and our segmenter against the package's ``get_speech_timestamps`` on real speech."""

from __future__ import annotations

import importlib.util
import warnings

import numpy as np
import pytest
import torch
from speech_data import audio_path, manifest_entries, require_speech_data
from torch import nn

from oasr.audio import load_audio
from oasr.vad import VAD_DETECTORS, DetectorSpecError, load_detector
from oasr.vad.energy import EnergyVAD
from oasr.vad.segmenter import speech_segments
from oasr.vad.silero import SileroOptions, SileroVAD
from oasr.vad.silero_checkpoint import JIT_RENAMES, SAFETENSORS_RENAMES, MissingVADPackageError, weights_path
from oasr.vad.silero_net import SileroState, SileroVADNet

pytest.importorskip("silero_vad", reason="the silero-vad package (test extra) holds the reference model")

# Different rates (16, 22.05, 44.1 kHz, resampled by oasr.audio) and lengths (1.1 s to 27 s).
PARITY_CLIPS = ["whisper_jfk", "ps_cards_001", "coqui_ljspeech_LJ001-0002", "mfa_acoustic_corpus"]


@pytest.fixture(scope="module")
def clips() -> dict[str, np.ndarray]:
    require_speech_data()
    entries = {e["id"]: e for e in manifest_entries()}
    return {name: load_audio(audio_path(entries[name])) for name in PARITY_CLIPS}


@pytest.fixture(scope="module")
def silero() -> SileroVAD:
    return SileroVAD.load()


def reference_module(weights: str = "jit") -> torch.jit.ScriptModule:
    """The package's TorchScript VAD (its own forward and 64-sample context handling), optionally with the
    safetensors checkpoint's weights put in its 16 kHz submodule."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.load, the package's own format
        module = torch.jit.load(str(weights_path("jit")), map_location="cpu")
    if weights == "safetensors":
        from safetensors.torch import load_file

        to_jit = {ours: jit for jit, ours in JIT_RENAMES.items()}
        ours = {SAFETENSORS_RENAMES.get(k, k): v for k, v in load_file(str(weights_path("safetensors"))).items()}
        state = module.state_dict()
        for key, value in ours.items():
            state[to_jit[key]] = value
        module.load_state_dict(state)
    return module


def reference_probs(module: torch.jit.ScriptModule, samples: np.ndarray) -> np.ndarray:
    """Chunk by chunk, as ``get_speech_timestamps`` calls it: 512 samples, the last zero-padded."""
    module.reset_states()
    x = torch.from_numpy(samples)
    out = []
    with torch.inference_mode():
        for start in range(0, len(x), 512):
            chunk = torch.nn.functional.pad(x[start : start + 512], (0, max(0, start + 512 - len(x))))
            out.append(module(chunk, 16000).item())
    return np.array(out, dtype=np.float32)


@pytest.mark.parametrize("weights", ["jit", "safetensors"])
def test_batched_streams_of_different_lengths_match_the_package_model_chunk_by_chunk(clips, weights) -> None:
    vad = SileroVAD.load(options=SileroOptions(weights=weights))
    module = reference_module(weights)
    ours = vad.speech_probs(list(clips.values()))
    for (name, samples), probs in zip(clips.items(), ours, strict=True):
        expected = reference_probs(module, samples)
        assert probs.shape == expected.shape == (-(-len(samples) // 512),)
        np.testing.assert_allclose(probs, expected, atol=1e-4, err_msg=name)


def test_the_two_packaged_checkpoints_are_different_models(clips) -> None:
    samples = clips["whisper_jfk"]
    jit = SileroVAD.load(options=SileroOptions(weights="jit")).speech_probs([samples])[0]
    safetensors = SileroVAD.load(options=SileroOptions(weights="safetensors")).speech_probs([samples])[0]
    assert np.abs(jit - safetensors).max() > 0.05
    assert ((jit > 0.5) == (safetensors > 0.5)).mean() > 0.9  # both find the same speech, mostly


def test_streaming_in_pieces_with_carried_state_equals_one_pass(clips, silero) -> None:
    a, b = clips["whisper_jfk"], clips["mfa_acoustic_corpus"]
    n = (min(len(a), len(b)) // 512) * 512
    chunks = torch.from_numpy(np.stack([a[:n], b[:n]])).reshape(2, -1, 512)
    whole, _ = silero.step(chunks, SileroState.initial(2))
    state = SileroState.initial(2)
    parts = []
    for piece in chunks.split(37, dim=1):
        probs, state = silero.step(piece, state)
        parts.append(probs)
    torch.testing.assert_close(torch.cat(parts, dim=1), whole, atol=1e-5, rtol=0)


def test_a_stream_that_ends_early_keeps_its_own_state(clips, silero) -> None:
    a, b = clips["ps_cards_001"], clips["whisper_jfk"]
    ta, tb = len(a) // 512, len(b) // 512
    chunks = torch.zeros(2, tb, 512)
    chunks[0, :ta] = torch.from_numpy(a[: ta * 512]).reshape(ta, 512)
    chunks[1] = torch.from_numpy(b[: tb * 512]).reshape(tb, 512)
    probs, state = silero.step(chunks, SileroState.initial(2), lengths=torch.tensor([ta, tb]))
    alone, alone_state = silero.step(chunks[:1, :ta], SileroState.initial(1))
    torch.testing.assert_close(probs[:1, :ta], alone, atol=1e-5, rtol=0)
    for got, want in ((state.h[:, :1], alone_state.h), (state.c[:, :1], alone_state.c),
                      (state.context[:1], alone_state.context)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_the_gpu_recurrence_and_the_cpu_step_loop_agree_on_ragged_batches() -> None:
    net = SileroVADNet().eval()  # random weights are enough: both paths run the same LSTM
    torch.manual_seed(0)
    features = torch.randn(4, 50, 128)
    h, c = torch.randn(1, 4, 128), torch.randn(1, 4, 128)
    for lengths in (torch.tensor([50, 50, 50, 50]), torch.tensor([7, 50, 0, 31])):
        with torch.inference_mode():
            whole = net.recur_whole(features, h, c, lengths)
            steps = net.recur_steps(features, h, c, lengths)
        for got, want in zip(steps, whole, strict=True):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(steps[1][:, 2], h[:, 2])  # the empty stream kept its state


def test_pieces_side_by_side_cover_the_stream_and_equal_one_pass_when_warmup_reaches_the_start(clips) -> None:
    samples = clips["mfa_acoustic_corpus"]
    one_pass = SileroVAD.load().speech_probs([samples])[0]
    pieces = SileroVAD.load(options=SileroOptions(piece_s=5.0, warmup_s=60.0)).speech_probs([samples])[0]
    np.testing.assert_allclose(pieces, one_pass, atol=1e-5)
    short_warmup = SileroVAD.load(options=SileroOptions(piece_s=5.0, warmup_s=1.0)).speech_probs([samples])[0]
    assert short_warmup.shape == one_pass.shape
    assert ((short_warmup > 0.5) == (one_pass > 0.5)).mean() > 0.8


def test_silero_network_is_built_from_the_layer_waist_only() -> None:
    bare = [path for path, m in SileroVADNet().named_modules()
            if type(m).__module__.startswith("torch.") and not isinstance(m, (nn.ModuleList, nn.Sequential))]
    assert bare == []


def test_missing_package_names_the_pip_command(monkeypatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "silero_vad" else real(name, *a))
    with pytest.raises(MissingVADPackageError, match="pip install silero-vad"):
        SileroVAD.load()


def test_loading_the_weights_leaves_torch_threads_alone() -> None:
    before = torch.get_num_threads()
    SileroVAD.load()
    assert torch.get_num_threads() == before


def test_registry_lists_and_loads_every_detector() -> None:
    assert VAD_DETECTORS.names() == ["energy", "fsmn", "silero"]
    # fsmn reads a FunASR model folder (tests/test_funasr_vad_detector.py loads it from one).
    for name in (n for n in VAD_DETECTORS.names() if VAD_DETECTORS.get(n).model_folder == "none"):
        detector = load_detector(name)
        probs = detector.speech_probs([np.zeros(1000, dtype=np.float32)])
        assert probs[0].shape == (-(-1000 // detector.chunk_samples),)
        assert [p.shape for p in detector.speech_probs([np.zeros(0, dtype=np.float32)] * 2)] == [(0,), (0,)]
    with pytest.raises(DetectorSpecError, match="energy, fsmn, silero"):
        load_detector("webrtc")


def test_energy_detector_marks_loud_chunks_and_not_digital_silence() -> None:
    rng = np.random.default_rng(0)
    noise = 3e-4 * rng.standard_normal(16000)  # about -70 dBFS
    tone = 0.1 * np.sin(2 * np.pi * 300 * np.arange(16000) / 16000)  # about -23 dBFS
    stream = np.concatenate([noise, tone, noise]).astype(np.float32)
    probs, silent = EnergyVAD().speech_probs([stream, np.zeros(8000, dtype=np.float32)])
    chunk = np.arange(len(probs)) * 512
    assert (probs[(chunk >= 16000 + 512) & (chunk < 32000 - 512)] > 0.99).all()
    assert (probs[(chunk < 16000 - 512) | (chunk >= 32000 + 512)] < 0.01).all()
    assert (silent < 0.01).all()


def test_segments_agree_with_the_package_get_speech_timestamps_on_real_speech(silero) -> None:
    from silero_vad import get_speech_timestamps

    require_speech_data()
    entries = [e for e in manifest_entries() if e["language"] == "en" and e["duration_s"] <= 15][:16]
    audios = [load_audio(audio_path(e)) for e in entries]
    module = reference_module("jit")
    threads = torch.get_num_threads()  # importing silero_vad sets it to 1
    try:
        for entry, samples, probs in zip(entries, audios, silero.speech_probs(audios), strict=True):
            expected = get_speech_timestamps(torch.from_numpy(samples), module)
            got = speech_segments(probs, len(samples))
            assert len(got) == len(expected), entry["id"]
            for seg, ref in zip(got, expected, strict=True):
                assert abs(seg.start - ref["start"]) <= 512 and abs(seg.end - ref["end"]) <= 512, entry["id"]
    finally:
        torch.set_num_threads(threads)


@pytest.mark.gpu
def test_gpu_batch_matches_cpu(clips, monkeypatch) -> None:
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)  # float32 convolutions and LSTM, not TF32
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    audios = list(clips.values())
    cpu = SileroVAD.load().speech_probs(audios)
    gpu = SileroVAD.load(device="cuda").speech_probs(audios)
    for a, b in zip(cpu, gpu, strict=True):
        np.testing.assert_allclose(b, a, atol=2e-3)
    energy_cpu = EnergyVAD().speech_probs(audios)
    energy_gpu = EnergyVAD(device="cuda").speech_probs(audios)
    for a, b in zip(energy_cpu, energy_gpu, strict=True):
        np.testing.assert_allclose(b, a, atol=1e-4)
