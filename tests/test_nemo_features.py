"""NeMo's log-mel frontend matches transformers' ParakeetFeatureExtractor (and, unnormalised, its
NemotronAsrStreamingFeatureExtractor), batched, and padding changes nothing."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import NemotronAsrStreamingFeatureExtractor, ParakeetFeatureExtractor

from oasr.features import FEATURE_EXTRACTORS
from oasr.features.nemo_logmel import NemoLogMel, NemoLogMelConfig, NemotronLogMel
from oasr.models import ARCHITECTURES

TOLERANCE = 1e-4


def clips(rng: np.random.Generator) -> list[np.ndarray]:
    """Noise, a chirp and near-silence of different lengths (not multiples of the hop)."""
    t = np.arange(16000 * 3) / 16000
    chirp = (0.3 * np.sin(2 * np.pi * (200 + 300 * t) * t)).astype(np.float32)
    return [
        (0.1 * rng.standard_normal(16000 * 2 + 77)).astype(np.float32),
        chirp,
        (0.2 * rng.standard_normal(4321)).astype(np.float32),
        np.full(8000, 1e-6, dtype=np.float32),
        (0.05 * rng.standard_normal(1000)).astype(np.float32),
    ]


def reference(audio: list[np.ndarray], num_mel_bins: int) -> tuple[torch.Tensor, torch.Tensor]:
    out = ParakeetFeatureExtractor(feature_size=num_mel_bins)(
        audio, sampling_rate=16000, return_tensors="pt", return_attention_mask=True
    )
    return out.input_features.transpose(1, 2), out.attention_mask.sum(-1)


@pytest.mark.parametrize("num_mel_bins", [80, 128])
def test_batched_features_match_transformers(num_mel_bins: int) -> None:
    audio = clips(np.random.default_rng(num_mel_bins))
    expected, expected_lengths = reference(audio, num_mel_bins)
    features, lengths = NemoLogMel(NemoLogMelConfig(num_mel_bins=num_mel_bins))(audio)
    assert features.shape == expected.shape == (len(audio), num_mel_bins, 16000 * 3 // 160 + 1)
    assert lengths.tolist() == expected_lengths.tolist() == [len(a) // 160 for a in audio]
    assert (features - expected).abs().max().item() <= TOLERANCE
    assert features.abs().sum().item() > 0


def test_unnormalised_features_match_the_nemotron_extractor() -> None:
    audio = clips(np.random.default_rng(1))
    out = NemotronAsrStreamingFeatureExtractor(feature_size=80)(audio, sampling_rate=16000, return_tensors="pt")
    expected, expected_lengths = out.input_features.transpose(1, 2), out.attention_mask.sum(-1)
    features, lengths = NemotronLogMel(NemoLogMelConfig(normalize=False))(audio)
    assert features.shape == expected.shape and lengths.tolist() == expected_lengths.tolist()
    assert (features - expected).abs().max().item() <= TOLERANCE
    assert features[0].mean().abs().item() > 1.0  # not normalised: the log-mel's own level


def test_each_input_alone_equals_its_row_in_the_batch() -> None:
    audio = clips(np.random.default_rng(0))
    extractor = NemoLogMel()
    batched, lengths = extractor(audio)
    for row, samples in enumerate(audio):
        alone, alone_length = extractor([samples])
        n = int(alone_length[0])
        assert n == int(lengths[row])
        assert (alone[0, :, :n] - batched[row, :, :n]).abs().max().item() <= TOLERANCE
        assert batched[row, :, n:].abs().max().item() == 0.0  # padded frames are zero, as the reference's


def test_padded_tensor_input_with_sample_counts_equals_the_list_input() -> None:
    audio = clips(np.random.default_rng(1))
    extractor = NemoLogMel()
    padded, num_samples = extractor.pad_batch(audio, "cpu")
    padded[1, num_samples[1] :] = 0.5  # junk past the end must not matter
    from_list, lengths = extractor(audio)
    from_tensor, tensor_lengths = extractor(padded, num_samples=num_samples)
    assert torch.equal(lengths, tensor_lengths)
    assert (from_list - from_tensor).abs().max().item() <= TOLERANCE


def test_registry_and_for_model_take_the_mel_count_from_the_encoder() -> None:
    assert FEATURE_EXTRACTORS.get("nemo_logmel") is NemoLogMel
    for name in ("parakeet_ctc", "parakeet_rnnt", "parakeet_tdt"):
        config = ARCHITECTURES.get(name).tiny_config()
        extractor = NemoLogMel.for_model(config)
        assert extractor.config.num_mel_bins == config.encoder_config.num_mel_bins


@pytest.mark.gpu
def test_cuda_features_match_cpu() -> None:
    # cuFFT and the CPU FFT round differently; in low-energy mel bins the log and the per-feature normalisation
    # magnify that to ~2e-4 (a chirp), hence a CUDA tolerance of 1e-3. The near-silent clip is left out: its
    # per-feature std is ~1e-7, so normalising magnifies the rounding past any tolerance (its features are noise).
    audio = [clip for clip in clips(np.random.default_rng(2)) if np.abs(clip).max() > 1e-3]
    extractor = NemoLogMel()
    cpu, cpu_lengths = extractor(audio)
    cuda, cuda_lengths = extractor(audio, device="cuda")
    assert cuda.device.type == "cuda"
    assert torch.equal(cpu_lengths, cuda_lengths.cpu())
    assert (cpu - cuda.cpu()).abs().max().item() <= 1e-3
