"""``python -m oasr.bench.diarization_cost`` end to end on CPU at a tiny scale: the tiny random Nemotron streaming
and diarization models, three live streams of each for two seconds and three offline files of 2-4 s. No timings
are asserted, only the run's shape: every live stream of both kinds closed, every file was transcribed (alone and
beside diarization) and diarized, and the figures are consistent."""

from __future__ import annotations

import json

import pytest

from oasr.bench.diarization_cost import main

NUM_STREAMS, NUM_FILES = 3, 3


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("bench-diarization") / "run.json"
    status = main(["--arch", "tiny", "--streams", str(NUM_STREAMS), "--seconds", "2", "--files", str(NUM_FILES),
                   "--min-seconds", "2", "--max-seconds", "4", "--device", "cpu", "--dtype", "float32",
                   "--json-out", str(out)])
    result = json.loads(out.read_text())
    assert status == 0, result
    return result


def test_the_report_has_both_halves(run):
    assert set(run) == {"bench", "arch", "diarization_arch", "weights", "device", "dtype", "live", "offline", "clean"}
    assert (run["arch"], run["diarization_arch"], run["device"], run["clean"]) == ("tiny", "tiny", "cpu", True)


def test_every_live_stream_of_both_kinds_closes_with_chunk_latencies(run):
    live = run["live"]
    assert (live["streams"], live["chunk_ms"], live["diarization_mode"]) == (NUM_STREAMS, 160, "low_latency")
    for kind in ("asr", "diarization"):
        assert live[kind]["streams_closed"] == NUM_STREAMS
        # two seconds per stream: at least one chunk of each stream, of either kind
        assert live[kind]["chunks"] >= NUM_STREAMS
        latency = live[kind]["chunk_latency_ms"]
        assert 0 <= latency["p50"] <= latency["p99"], (kind, latency)
    assert live["asr"]["chunks"] > live["diarization"]["chunks"]  # 160 ms ASR chunks, 720 ms diarization ones


def test_every_offline_file_is_transcribed_and_diarized(run):
    offline = run["offline"]
    assert offline["files"] == NUM_FILES and 2 * NUM_FILES <= offline["audio_s"] <= 4 * NUM_FILES
    assert offline["asr_alone"]["files_transcribed"] == NUM_FILES
    diarized = offline["with_diarization"]
    assert diarized["files_transcribed"] == diarized["files_diarized"] == NUM_FILES
    for side in ("asr_alone", "with_diarization"):
        assert offline[side]["wall_s"] > 0
        assert offline[side]["rtfx"] == pytest.approx(offline["audio_s"] / offline[side]["wall_s"], rel=0.05)
    ratio = offline["with_diarization"]["wall_s"] / offline["asr_alone"]["wall_s"] - 1
    assert offline["diarization_cost"] == pytest.approx(ratio, rel=0.05, abs=0.01)
