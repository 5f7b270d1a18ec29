"""FSMN-VAD's network against FunASR's on a tiny random model built with funasr's own classes
(tests/data/funasr/fsmn_vad.json, made by scripts/funasr_oracle/build_streaming.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from oasr.errors import CheckpointError
from oasr.models.fsmn_vad.net import load_fsmn_vad

DATA = Path(__file__).parent / "data" / "funasr"


@pytest.fixture(scope="module")
def golden() -> dict:
    return json.loads((DATA / "fsmn_vad.json").read_text())


@pytest.fixture(scope="module")
def net():
    return load_fsmn_vad(DATA / "fsmn_vad")


def test_fsmn_silence_scores_equal_funasr(golden, net):
    from tests.speech_data import clips

    for clip, expected in zip(clips(golden["clips"]), golden["silence_scores"]):
        name = clip.id
        with torch.no_grad():
            scores = net.silence_probabilities(torch.from_numpy(clip.audio)).numpy()
        assert len(scores) == expected["num_frames"], name
        np.testing.assert_allclose(scores[: len(expected["head"])], expected["head"], atol=1e-4, err_msg=name)
        assert abs(float(scores.mean()) - expected["mean"]) < 1e-4, name


def test_fsmn_folder_without_fsmn_encoder_is_refused(tmp_path):
    (tmp_path / "config.yaml").write_text("encoder: SANMEncoder\nencoder_conf: {}\n")
    with pytest.raises(CheckpointError, match="not FSMN"):
        load_fsmn_vad(tmp_path)


def test_fsmn_missing_folder_is_refused(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_fsmn_vad(tmp_path / "absent")


def test_fsmn_offline_segments_equal_funasr(golden):
    from tests.speech_data import clips

    from oasr.models.fsmn_vad.detector import FsmnVAD

    detector = FsmnVAD.load("cpu", DATA / "fsmn_vad")
    for clip, expected in zip(clips(golden["clips"]), golden["offline"]):
        assert detector.segments(clip.audio) == expected, clip.id
        probs = detector.speech_probs([clip.audio])[0]
        assert len(probs) == -(-len(clip.audio) // detector.chunk_samples)
        assert ((probs >= 0) & (probs <= 1)).all()


def test_fsmn_detector_without_folder_is_refused():
    from oasr.models.fsmn_vad.detector import FsmnVAD

    with pytest.raises(CheckpointError, match="model folder"):
        FsmnVAD.load("cpu")


def test_fsmn_state_machine_equals_funasr_on_hand_made_runs(golden, net):
    """Pauses long enough to end a segment, short ones that do not, speech up to the last frame, and a blip
    too short to start one: FunASR's state machine at the folder's own thresholds."""
    from oasr.vad.fsmn_segments import FsmnSegmentConfig, FsmnSegmenter

    config = FsmnSegmentConfig.from_model_conf(net.model_conf)
    for run in golden["synthetic"]:
        silence = [p for count, p in run["silence"] for _ in range(count)]
        assert FsmnSegmenter(config).run(silence, [0.0] * len(silence)) == run["segments"], run["silence"]
