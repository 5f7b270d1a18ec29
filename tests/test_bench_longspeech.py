"""The long-speech bench (``oasr.bench.longspeech``) on CPU at a tiny random Whisper: both sides decode every
window's own token count through their long-form paths, and the report says so. No timings are asserted."""

import json

import numpy as np
import pytest
import torch

from oasr.bench.longspeech import (
    TOKENS_PER_30S,
    WINDOW_SAMPLES,
    OasrLongForm,
    PeerLongForm,
    Timed,
    Workload,
    build_workload,
    encoder_flops,
    parse_args,
    report,
    token_counts_from_manifest,
)
from oasr.bench.random_model import WHISPER_SHAPES, random_whisper
from oasr.models.embedded import resolve_embedded


@pytest.fixture(scope="module")
def tiny():
    tokenizer_file = resolve_embedded("base").directory / "tokenizer.json"
    loaded, state = random_whisper("whisper-tiny", device=torch.device("cpu"), dtype=torch.float32,
                                   tokenizer_file=tokenizer_file)
    return loaded, state, tokenizer_file


def _workload() -> Workload:
    # A recording of two windows and one of one, each window with its own count: a peer batch of 2 holds windows
    # of both recordings, and OASR's long-form path cuts the first recording in two.
    rng = np.random.default_rng(1)
    recordings = tuple((0.05 * rng.standard_normal(n * WINDOW_SAMPLES)).astype(np.float32) for n in (2, 1))
    return Workload(recordings, ((3, 7), (5,)))


def test_both_sides_decode_each_windows_token_count_and_the_report_says_so(tiny):
    from oasr.engine.config import EngineConfig

    loaded, state, tokenizer_file = tiny
    workload = _workload()
    ours = OasrLongForm(loaded, batch_size=4, config=EngineConfig())
    peer = PeerLongForm(loaded, state, tokenizer_file)
    our_seconds, our_counts = ours.run(workload)
    peer_seconds, peer_counts = peer.run(workload, batch_size=2)
    assert our_counts == [3, 7, 5]
    assert peer_counts == [3, 7, 5]

    out = report({"arch": "tiny"}, workload, Timed((our_seconds,), our_counts),
                 {2: Timed((peer_seconds,), peer_counts)})
    json.dumps(out)  # what main prints
    assert out["audio_seconds"] == 90.0 and out["num_windows"] == 3 and out["tokens_expected"] == 15
    assert out["oasr"]["tokens_decoded"] == out["transformers"]["tokens_decoded"] == 15
    assert out["oasr_counts_match"] and out["transformers_counts_match"]
    assert out["transformers"]["batch_size"] == 2
    assert out["oasr"]["rtfx"] == round(90.0 / our_seconds, 1)
    assert out["transformers"]["rtfx"] == round(90.0 / peer_seconds, 1)
    assert out["rtfx_ratio"] == round(peer_seconds / our_seconds, 2)


def test_report_flags_a_side_that_decoded_other_counts():
    workload = _workload()
    peers = {8: Timed((4.0,), [3, 6, 5]), 16: Timed((3.0,), [3, 7, 5])}
    out = report({}, workload, Timed((2.0, 1.0), [3, 7, 5]), peers)
    assert out["oasr_counts_match"] and not out["transformers_counts_match"]
    assert out["oasr"]["seconds"] == 1.0 and out["transformers"]["batch_size"] == 16
    assert out["rtfx_ratio"] == 3.0
    assert "transformers" not in report({}, workload, Timed((1.0,), [3, 7, 5]), {})


def test_workload_is_whole_windows_with_counts_drawn_from_the_list():
    a = build_workload(3, 2.0, (100, 150), seed=4)
    assert [len(r) for r in a.recordings] == [4 * WINDOW_SAMPLES] * 3
    assert len(a.window_lengths) == 12 and set(a.window_lengths) <= {100, 150} and len(set(a.window_lengths)) == 2
    b = build_workload(3, 2.0, (100, 150), seed=4)
    assert a.lengths == b.lengths and np.array_equal(a.recordings[2], b.recordings[2])
    assert a.with_lengths(1).window_lengths == [1] * 12


def test_committed_counts_are_running_speech():
    assert 100 <= np.median(TOKENS_PER_30S) <= 150 and min(TOKENS_PER_30S) >= 80


def test_counts_from_a_manifest_keep_running_speech_scaled_to_30_s(tmp_path):
    class Words:
        def encode(self, text):
            return text.split()

    rows = [{"text": "a " * 40, "duration_s": 10.0},  # 120 per 30 s
            {"text": "a " * 40, "duration_s": 4.0},  # too short a clip
            {"text": "a " * 10, "duration_s": 10.0},  # 30 per 30 s: not running speech
            {"text": "a " * 100, "duration_s": 6.0},  # 500, capped
            {"duration_s": 20.0}]  # no transcript
    manifest = tmp_path / "manifest.jsonl"
    manifest.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert token_counts_from_manifest(manifest, Words()) == (120, 224)


def test_encoder_flops_of_a_large_v3_window():
    # Issue 41's figure: 2.26 TFLOP per 30 s window of large-v3 (the stem convolutions add 0.02).
    assert encoder_flops(WHISPER_SHAPES["whisper-large-v3"]) == pytest.approx(2.27e12, rel=0.005)


@pytest.mark.parametrize("argv, message", [
    (["--minutes", "0.1"], "shorter than one 30 s window"),
    (["--recordings", "0"], "must be at least 1"),
    (["--token-counts", "300"], "at most 224 tokens"),
    (["--tokenizer", "/nonexistent/tokenizer.json"], "no such file"),
])
def test_bad_arguments_are_refused_with_a_message(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
