"""``python -m oasr.bench.grpc_streams`` end to end on CPU at a tiny scale: a real ``oasr serve --grpc-port`` of
the tiny random Nemotron streaming model, three streams on each front end for two seconds of audio. No timings
are asserted, only the run's shape: every stream of both front ends got its final, interim results came on
both, and the latencies are non-negative and ordered."""

from __future__ import annotations

import json

import pytest

from oasr.bench.grpc_streams import main

NUM_STREAMS = 3


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("bench-grpc") / "run.json"
    # blank bias 0: the tiny random joint then emits tokens on every clip, so both sides send interim results
    status = main(["--arch", "tiny", "--streams", str(NUM_STREAMS), "--seconds", "2", "--chunk-ms", "100",
                   "--stagger-s", "0.2", "--warmup-streams", "0", "--blank-bias", "0", "--device", "cpu",
                   "--dtype", "float32", "--json-out", str(out)])
    result = json.loads(out.read_text())
    assert status == 0, (result["grpc"]["first_errors"], result["realtime"]["first_errors"])
    return result


def test_the_report_names_both_front_ends_and_the_load(run):
    assert set(run) == {"bench", "arch", "weights", "device", "dtype", "streams", "chunk_ms", "seconds", "grpc",
                        "realtime", "clean"}
    assert (run["arch"], run["streams"], run["chunk_ms"], run["device"]) == ("tiny", NUM_STREAMS, 100, "cpu")
    assert run["clean"] is True


@pytest.mark.parametrize("side", ["grpc", "realtime"])
def test_every_stream_gets_its_final_and_interim_results_come(run, side):
    result = run[side]
    assert result["errors"] == 0 and result["first_errors"] == []
    assert result["streams_completed"] == NUM_STREAMS
    assert result["finals"] >= NUM_STREAMS
    assert result["interim"] > 0


@pytest.mark.parametrize("side", ["grpc", "realtime"])
def test_latencies_are_non_negative_and_ordered(run, side):
    assert run[side]["max_send_lateness_s"] >= 0
    for name in ("interim", "final"):
        values = [run[side]["latency_s"][name][q] for q in ("p50", "p90", "p99")]
        assert all(v is not None and v >= 0 for v in values), (side, name, values)
        assert values == sorted(values), (side, name, values)
