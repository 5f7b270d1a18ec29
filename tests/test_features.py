"""The torch log-mel frontend matches transformers' WhisperFeatureExtractor."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import WhisperFeatureExtractor

from oasr.audio import load_audio
from oasr.features import FEATURE_EXTRACTORS
from oasr.features.whisper_logmel import WhisperLogMelConfig
from speech_data import audio_path, manifest_entries, require_speech_data

TOLERANCE = 1e-4


def clips(rng: np.random.Generator) -> list[np.ndarray]:
    """Noise and a chirp of lengths below, at and above one window, plus near-silence."""
    t = np.arange(16000 * 12) / 16000
    chirp = (0.3 * np.sin(2 * np.pi * (200 + 300 * t) * t)).astype(np.float32)
    return [
        (0.1 * rng.standard_normal(400)).astype(np.float32),
        chirp,
        (0.2 * rng.standard_normal(16000 * 30)).astype(np.float32),
        (0.2 * rng.standard_normal(16000 * 33)).astype(np.float32),
        np.full(16000, 1e-6, dtype=np.float32),
    ]


@pytest.mark.parametrize("num_mel_bins", [80, 128])
def test_batched_log_mel_matches_transformers(num_mel_bins: int) -> None:
    audio = clips(np.random.default_rng(num_mel_bins))
    reference = WhisperFeatureExtractor(feature_size=num_mel_bins)(
        audio, sampling_rate=16000, return_tensors="pt"
    ).input_features
    extractor = FEATURE_EXTRACTORS.get("whisper_logmel")(WhisperLogMelConfig(num_mel_bins=num_mel_bins))
    ours = extractor(audio)
    assert ours.shape == reference.shape == (len(audio), num_mel_bins, 3000)
    assert (ours - reference).abs().max().item() <= TOLERANCE


def test_log_mel_matches_transformers_on_real_speech() -> None:
    require_speech_data()
    entries = [e for e in manifest_entries() if e["duration_s"] <= 30][:8]
    audio = [load_audio(audio_path(e), channel=e.get("channel")) for e in entries]
    reference = WhisperFeatureExtractor()(audio, sampling_rate=16000, return_tensors="pt").input_features
    ours = FEATURE_EXTRACTORS.get("whisper_logmel")()(audio)
    assert (ours - reference).abs().max().item() <= TOLERANCE


def test_batching_does_not_change_a_row() -> None:
    audio = clips(np.random.default_rng(1))
    extractor = FEATURE_EXTRACTORS.get("whisper_logmel")()
    batched = extractor(audio)
    for i, samples in enumerate(audio):
        assert torch.equal(extractor([samples])[0], batched[i])


def test_padded_tensor_input_equals_list_input() -> None:
    audio = clips(np.random.default_rng(2))
    extractor = FEATURE_EXTRACTORS.get("whisper_logmel")()
    padded = extractor.pad_batch(audio, "cpu")
    assert torch.equal(extractor(padded), extractor(audio))


@pytest.mark.gpu
def test_log_mel_on_cuda_matches_cpu() -> None:
    audio = clips(np.random.default_rng(3))
    extractor = FEATURE_EXTRACTORS.get("whisper_logmel")()
    cpu = extractor(audio)
    cuda = extractor(audio, device="cuda").cpu()
    assert (cpu - cuda).abs().max().item() <= TOLERANCE


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_pad_to_device_places_each_input_and_zeroes_the_rest(device: str) -> None:
    from oasr.features.upload import pad_to_device

    rng = np.random.default_rng(4)
    audio = [rng.standard_normal(n).astype(np.float32) for n in (7, 0, 12, 3)]
    batch, lengths = pad_to_device(audio, device)
    assert batch.shape == (4, 12) and batch.device.type == device
    assert lengths.tolist() == [7, 0, 12, 3]
    cut, cut_lengths = pad_to_device(audio + [[0.5] * 2], device, width=5)
    assert cut.shape == (5, 5) and cut_lengths.tolist() == [5, 0, 5, 3, 2]
    for i, samples in enumerate(audio):
        assert torch.equal(batch[i, : len(samples)].cpu(), torch.from_numpy(samples))
        assert not batch[i, len(samples) :].any()
        assert torch.equal(cut[i, : min(len(samples), 5)].cpu(), torch.from_numpy(samples[:5]))
        assert not cut[i, len(samples) :].any()
    assert cut[4].tolist() == [0.5, 0.5, 0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="no audio"):
        pad_to_device([], device)


def test_gather_into_copies_every_row_in_order_on_several_threads(monkeypatch) -> None:
    import oasr.features.upload as upload

    rows = [torch.arange(n, dtype=torch.float32) + 1000 * i for i, n in enumerate([7, 1, 300, 64, 5])]
    for per_thread in (1 << 30, 64):  # one thread (torch.cat), then the threaded split
        monkeypatch.setattr(upload, "_BYTES_PER_THREAD", per_thread)
        with torch.inference_mode():  # as the runners call it: the workers must write inference tensors too
            out = torch.full((sum(len(r) for r in rows),), -1.0)
            upload._gather_into(out, rows)
        assert torch.equal(out, torch.cat(rows))
