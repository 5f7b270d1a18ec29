"""The ``funasr_fbank`` frontend (Kaldi fbank, LFR 7/6, CMVN from am.mvn) against FunASR's ``WavFrontend``.

tests/data/funasr/paraformer.json holds, for each shared clip, what funasr 1.4.16's frontend gave with the
Paraformer folder's am.mvn (its fbank from kaldi-native-fbank, as FunASR computes it without torchaudio): the
first and last 8 frames in full and every frame's and every column's mean. CI never runs FunASR; it reads these.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from oasr.features.funasr_fbank import FunasrFbank, FunasrFbankConfig, kaldi_mel_banks
from oasr.models.converters.funasr import read_cmvn
from tests.speech_data import clips

DATA = Path(__file__).parent / "data" / "funasr"
TOLERANCE = 1e-4


def golden() -> dict:
    return json.loads((DATA / "paraformer.json").read_text(encoding="utf-8"))["features"]


def frontend() -> FunasrFbank:
    shift, scale = read_cmvn(DATA / "paraformer" / "am.mvn", "test")
    return FunasrFbank(FunasrFbankConfig(cmvn_shift=tuple(shift), cmvn_scale=tuple(scale)))


def _check(features: torch.Tensor, length: int, expected: dict) -> None:
    rows = features[:length].double().cpu().numpy()
    assert length == expected["num_frames"] and rows.shape[1] == expected["dim"] == 560
    np.testing.assert_allclose(rows[:8], expected["head"], atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(rows[-8:], expected["tail"], atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(rows.mean(axis=1), expected["frame_means"], atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(rows.mean(axis=0), expected["column_means"], atol=TOLERANCE, rtol=0)


def test_batched_features_are_funasrs_within_1e4() -> None:
    expected = golden()
    audio = [clip.audio for clip in clips(list(expected))]
    features, lengths = frontend()(audio)
    for i, name in enumerate(expected):
        _check(features[i], int(lengths[i]), expected[name])
        assert not features[i, int(lengths[i]):].any()  # padded frames are zero, as FunASR pads


def test_a_row_batched_equals_the_row_alone() -> None:
    audio = [clip.audio for clip in clips(list(golden()))]
    extractor = frontend()
    batched, lengths = extractor(audio)
    for i, samples in enumerate(audio):
        alone, length = extractor([samples])
        assert int(length[0]) == int(lengths[i])
        torch.testing.assert_close(batched[i, : int(length[0])], alone[0], rtol=0, atol=1e-5)


def test_frame_counts_follow_kaldi_snip_edges_and_lfr() -> None:
    extractor = frontend()
    samples = torch.tensor([0, 399, 400, 559, 560, 400 + 160 * 6, 400 + 160 * 6 - 1])
    # Kaldi: 1 + (N - 400) // 160 whole frames (none under 400 samples); LFR: ceil(frames / 6).
    assert extractor.fbank_lengths(samples).tolist() == [0, 0, 1, 1, 2, 7, 6]
    assert extractor.frame_lengths(samples).tolist() == [0, 0, 1, 1, 1, 2, 1]


def test_kaldi_mel_filters_are_triangles_over_the_spectrum() -> None:
    banks = kaldi_mel_banks(80, 512, 16_000)
    assert banks.shape == (80, 257) and (banks >= 0).all() and banks.max() <= 1
    assert not banks[:, 0].any() and not banks[:, -1].any()  # below 20 Hz and the Nyquist bin weigh nothing


def test_unknown_window_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown fbank window 'blackmann'"):
        FunasrFbankConfig(window="blackmann")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_features_equal_the_host_ones() -> None:
    audio = [clip.audio for clip in clips(list(golden()))]
    extractor = frontend()
    host, lengths = extractor(audio)
    device, device_lengths = extractor(audio, device="cuda")
    assert device_lengths.cpu().tolist() == lengths.tolist()
    torch.testing.assert_close(device.cpu(), host, rtol=0, atol=TOLERANCE)
