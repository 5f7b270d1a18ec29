"""``oasr bench realtime`` end to end on CPU: a real ``oasr serve`` of tiny.en, two sessions of one JFK turn each,
sent eight times faster than real time, one from each of two client processes, to a server of two HTTP worker
processes (its histograms summed over both) whose engine core is profiled. No timings are asserted, only the
run's structure and invariants: every turn completed, no errors, latencies non-negative and ordered, the audio the
clients sent is what the server counted, and each completed transcript is the offline transcript of what the
server heard. The server-histogram
reading (``histogram_quantile``) is pinned on fabricated buckets."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import oasr
from oasr.audio import load_audio
from oasr.bench.realtime import _serve_args, histogram_quantile, main, parse_args
from test_realtime import as_served, pcm16_24k

JFK = Path(oasr.__file__).parent / "assets" / "jfk.flac"
NUM_SESSIONS, NUM_TURNS = 2, 1
NUM_BULK, BULK_S = 1, 15  # one client uploading 15 s files (JFK repeated) beside the turns


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("bench-realtime")
    shutil.copy(JFK, folder / "jfk.flac")
    (folder / "manifest.jsonl").write_text(json.dumps({"audio": "jfk.flac"}) + "\n")
    out = folder / "run.json"
    status = main(["--model", "tiny.en", "--manifest", str(folder / "manifest.jsonl"), "--sessions",
                   str(NUM_SESSIONS), "--turns-per-session", str(NUM_TURNS), "--speed", "8", "--stagger-s", "0.2",
                   "--warmup-sessions", "0", "--client-processes", "2", "--api-workers", "2", "--device", "cpu",
                   "--dtype", "float32",
                   "--transcripts", "--profile-core", str(folder / "core.prof"),
                   "--bulk-uploads", str(NUM_BULK), "--bulk-seconds", str(BULK_S),
                   "--json-out", str(out)])
    result = json.loads(out.read_text())
    assert status == 0, result["first_errors"]
    return result


def test_every_turn_completes_without_errors(run):
    expected = NUM_SESSIONS * NUM_TURNS
    assert run["clean"] is True
    assert run["errors"] == 0 and run["first_errors"] == []
    assert run["turns_started"] == run["turns_completed"] == run["turns_expected"] == expected
    assert run["sessions_completed"] == NUM_SESSIONS and run["client_processes"] == 2 and run["api_workers"] == 2
    assert len(run["core_profiles"]) == 1  # one engine core behind both workers, profiled as asked
    assert run["model_streams"] is False  # tiny.en transcribes a turn once it is committed
    assert run["server"]["completion_s"]["count"] == expected
    assert run["server"]["delta_s"]["count"] == 0  # only streamed deltas are observed there


def test_bulk_uploads_ran_beside_the_turns_and_each_was_answered(run):
    bulk = run["bulk"]
    assert bulk["clients"] == NUM_BULK and bulk["upload_audio_s"] == BULK_S
    assert bulk["failed"] == 0 and bulk["first_errors"] == []
    # each client finishes the upload it has in flight when the turns end, so every client has one answer
    assert bulk["completed"] >= NUM_BULK and bulk["latency_s"]["p50"] > 0


def test_the_audio_sent_is_the_audio_the_server_counted(run):
    jfk_s = len(pcm16_24k(load_audio(JFK))) / 2 / 24_000
    assert run["audio_s_streamed"] == pytest.approx(NUM_SESSIONS * NUM_TURNS * jfk_s, abs=1e-3)
    assert run["server"]["audio_s_received"] == pytest.approx(run["audio_s_streamed"], abs=1e-3)


def test_latencies_are_non_negative_and_a_first_delta_precedes_its_completion(run):
    latency = run["latency_s"]
    assert "delta_after_last_append" not in latency  # a streaming model's figure
    for name in ("completion", "first_delta_after_commit", "first_partial"):
        values = [latency[name][q] for q in ("p50", "p90", "p99")]
        assert all(v is not None and v >= 0 for v in values), (name, values)
        assert values == sorted(values), (name, values)
    assert latency["first_delta_after_commit"]["p99"] <= latency["completion"]["p99"]
    assert run["deltas"] >= NUM_SESSIONS * NUM_TURNS
    server = run["server"]["completion_s"]
    assert 0 <= server["p50"] <= server["p99"]
    assert run["pacing"]["max_lateness_s"] >= 0 and run["pacing"]["late_appends"] >= 0
    assert run["pacing"]["fell_behind"] == (run["pacing"]["sessions_behind"] > 0)


def test_each_turn_is_transcribed_as_the_offline_engine_transcribes_what_the_server_heard(run, tiny_en):
    heard = as_served(pcm16_24k(load_audio(JFK)))
    expected = oasr.transcribe([heard], model=tiny_en)[0].text
    assert "ask not what your country can do for you" in expected.lower()
    transcripts = run["transcripts"]
    assert [(t["session"], t["turn"]) for t in transcripts] == [(s, 0) for s in range(NUM_SESSIONS)]
    assert all(t["clip"] == "jfk.flac" for t in transcripts)
    assert [t["transcript"] for t in transcripts] == [expected] * NUM_SESSIONS
    assert all(t["audio_s"] == pytest.approx(len(load_audio(JFK)) / 16000, abs=0.01) for t in transcripts)
    assert all(0 < t["completion_s"] < 300 for t in transcripts)


def test_histogram_quantiles_interpolate_within_their_bucket():
    buckets = [(0.1, 2.0), (0.5, 6.0), (1.0, 10.0), (math.inf, 10.0)]
    assert histogram_quantile(buckets, 0.1) == pytest.approx(0.05)  # rank 1 of 2 in [0, 0.1]
    assert histogram_quantile(buckets, 0.5) == pytest.approx(0.4)  # rank 5: 3 of 4 into [0.1, 0.5]
    assert histogram_quantile(buckets, 0.99) == pytest.approx(0.5 + 0.5 * 3.9 / 4)
    assert histogram_quantile([(0.1, 0.0), (1.0, 1.0), (math.inf, 3.0)], 0.99) == 1.0  # in +Inf: the last bound
    assert histogram_quantile([(0.1, 0.0), (math.inf, 0.0)], 0.5) is None
    assert histogram_quantile([], 0.5) is None


def test_the_cli_routes_oasr_bench_realtime_to_its_own_arguments():
    out = subprocess.run([sys.executable, "-m", "oasr.cli", "bench", "realtime", "--help"], capture_output=True,
                         text=True, check=True).stdout
    assert "oasr bench realtime" in out and "--nemotron-shape" in out and "--sessions" in out


def test_the_server_is_started_with_the_api_workers_asked_for():
    command = _serve_args(parse_args(["--api-workers", "3"]), "tiny.en", 8000)
    assert command[command.index("--api-workers") + 1] == "3"
    with pytest.raises(SystemExit):
        parse_args(["--api-workers", "0"])
