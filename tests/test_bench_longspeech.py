"""The long-speech bench (``oasr.bench.longspeech``) on CPU at a tiny random Whisper: both sides decode every
window's own token count through their long-form paths, and the report says so. No timings are asserted."""

import json

import numpy as np
import pytest

from oasr.bench.longspeech import (
    TOKENS_PER_30S,
    WINDOW_SAMPLES,
    Timed,
    Workload,
    build_workload,
    encoder_flops,
    main,
    parse_args,
    report,
    token_counts_from_manifest,
)
from oasr.bench.random_model import WHISPER_SHAPES


def test_both_sides_decode_each_windows_token_count_through_the_whole_bench(capsys):
    # Seed 2 draws (3, 7) and (7, 3) for the two recordings' windows: the counts differ within a recording, and
    # transformers' first batch of 3 holds windows of both recordings, of different counts.
    assert build_workload(2, 1.0, (3, 7), seed=2).lengths == ((3, 7), (7, 3))
    assert main(["--arch", "tiny", "--device", "cpu", "--dtype", "float32", "--recordings", "2", "--minutes", "1",
                 "--token-counts", "3", "7", "--seed", "2", "--peer-batch-sizes", "3", "--rounds", "1",
                 "--batch-size", "4"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["arch"] == "tiny" and out["token_counts_source"] == "--token-counts"
    assert out["audio_seconds"] == 120.0 and out["num_windows"] == 4 and out["tokens_expected"] == 20
    assert out["oasr_counts_match"] and out["transformers_counts_match"]
    assert out["oasr"]["tokens_decoded"] == out["transformers"]["tokens_decoded"] == 20
    assert out["transformers"]["batch_size"] == 3 and list(out["transformers"]["rounds_by_batch"]) == ["3"]
    ours, theirs = out["oasr"]["seconds"], out["transformers"]["seconds"]
    assert out["oasr"]["rtfx"] == pytest.approx(120.0 / ours, abs=0.06)
    assert out["rtfx_ratio"] == pytest.approx(theirs / ours, rel=0.01, abs=0.006)
    encoder = out["oasr_encoder"]
    assert encoder["tflop_per_window"] == pytest.approx(0.037, abs=0.001)  # tiny: 4 layers of 384 over 1500 frames
    tflops = 4 * encoder["tflop_per_window"] / encoder["one_token_seconds"]
    assert encoder["tflops_at_least"] == pytest.approx(tflops, abs=0.06)
    assert encoder["share_of_fp16_dense"] == pytest.approx(tflops / 790, abs=0.001)


def _workload() -> Workload:
    rng = np.random.default_rng(1)
    recordings = tuple((0.05 * rng.standard_normal(n * WINDOW_SAMPLES)).astype(np.float32) for n in (2, 1))
    return Workload(recordings, ((3, 7), (5,)))


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
