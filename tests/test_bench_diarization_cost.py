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
    assert set(run) == {"bench", "arch", "diarization_arch", "weights", "speaker_activity", "device", "dtype", "live",
                        "offline", "clean"}
    assert (run["arch"], run["diarization_arch"], run["device"], run["clean"]) == ("tiny", "tiny", "cpu", True)
    assert run["speaker_activity"] == "steady"


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
    assert diarized["segments"] == NUM_FILES  # steady: speaker 0 talks through each file, one segment a file
    for side in ("asr_alone", "with_diarization"):
        assert offline[side]["wall_s"] > 0
        assert offline[side]["rtfx"] == pytest.approx(offline["audio_s"] / offline[side]["wall_s"], rel=0.05)
    ratio = offline["with_diarization"]["wall_s"] / offline["asr_alone"]["wall_s"] - 1
    assert offline["diarization_cost"] == pytest.approx(ratio, rel=0.05, abs=0.01)


@pytest.mark.parametrize("activity", ["steady", "noise"])
def test_the_stand_in_speakers_talk_as_asked(tmp_path, activity):
    """steady: speaker 0 over the threshold in every frame, the others under it in every frame; noise: the random
    classifier's speakers switch many times a second (what made the host's segment work swamp the forwards)."""
    from oasr.bench.diarization_cost import build_diarization_model, noise_clips
    from oasr.diarization.loader import load_diarizer
    from oasr.diarization.offline import OfflineDiarizer
    from oasr.diarization.segments import speaker_segments

    build_diarization_model("tiny", tmp_path, activity=activity)
    diarizer = OfflineDiarizer(load_diarizer(tmp_path, device="cpu", dtype="float32"))
    audio = noise_clips([3.0, 5.0], seed=3)
    for samples, probs in zip(audio, diarizer.probabilities(audio), strict=True):
        segments = speaker_segments(probs, diarizer.loaded.frame_seconds)
        if activity == "steady":
            assert (probs[:, 0] > 0.9).all() and (probs[:, 1:] < 0.1).all()
            assert [(s.start, s.speaker) for s in segments] == [(0.0, 0)]
        else:
            assert len(segments) > 10 * len(samples) / 16000, len(segments)


def test_an_unknown_speaker_activity_is_refused(tmp_path):
    from oasr.bench.diarization_cost import build_diarization_model

    with pytest.raises(ValueError, match="speaker activity 'chatty'"):
        build_diarization_model("tiny", tmp_path, activity="chatty")
