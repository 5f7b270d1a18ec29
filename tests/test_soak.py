"""A small soak of a real ``oasr serve`` subprocess: faults, a restart, and answers equal to the offline text."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

import oasr
from oasr.bench import soak
from oasr.bench.soak import RestartWindow, SoakConfig, plan
from oasr.bench.soak_faults import FAULT_KINDS, REFUSED_BODIES, lying_wav
from oasr.bench.soak_realtime import REALTIME_FAULTS, FaultOutcome, summarize_faults
from oasr.bench.soak_server import ServerOptions, SoakServer

JFK = Path(oasr.__file__).parent / "assets" / "jfk.flac"


def _clips(tmp_path: Path) -> Path:
    """Two short slices of the JFK clip (short clips keep the decode cheap), listed in a manifest."""
    import soundfile as sf

    samples, rate = sf.read(JFK, dtype="float32")
    rows = []
    for name, start_s, end_s in (("opening", 0.0, 3.0), ("closing", 6.5, 11.0)):
        sf.write(tmp_path / f"{name}.flac", samples[int(start_s * rate) : int(end_s * rate)], rate)
        rows.append({"audio": f"{name}.flac", "duration_s": end_s - start_s, "language": "en"})
    manifest = tmp_path / "manifest.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return manifest


def test_the_plan_has_the_asked_share_of_faults_and_every_kind() -> None:
    config = SoakConfig("tiny.en", "cpu", 40, 8, 0.2, 60.0, 4.0, (JFK, JFK))
    planned = plan(config)
    kinds = [p.kind for p in planned]
    assert len(planned) == 40 and sum(k != "normal" for k in kinds) == 8
    assert set(kinds) == {"normal", *FAULT_KINDS}
    assert plan(config) == planned and [p.clip for p in planned[:4]] == [0, 1, 0, 1]


def test_a_transport_error_is_lost_unless_the_restart_explains_it() -> None:
    window = RestartWindow(start=10.0, end=20.0)
    closed = httpx.RemoteProtocolError("Server disconnected without sending a response.")
    outcome = soak._transport_outcome
    assert outcome(closed, 5.0, 12.0, window) == "refused_by_restart"  # in flight at the SIGTERM
    assert outcome(httpx.ConnectError("refused"), 15.0, 15.1, window) == "refused_by_restart"
    assert outcome(closed, 21.0, 22.0, window) == "lost"  # after the restart: nothing explains it
    assert outcome(closed, 1.0, 9.0, RestartWindow()) == "lost"
    # a reset is no answer, an oversize upload's too: the server answers it 413 and lingers before it closes
    assert outcome(httpx.WriteError("reset"), 21.0, 22.0, window) == "lost"
    assert outcome(httpx.ReadTimeout("slow"), 21.0, 22.0, window) == "hung"
    assert outcome(httpx.ReadTimeout("slow"), 12.0, 14.0, window) == "hung"  # a hang is never excused


def test_the_lying_wav_claims_one_hertz() -> None:
    import io
    import random

    import soundfile as sf

    info = sf.info(io.BytesIO(lying_wav(random.Random(0))))
    assert (info.samplerate, info.frames, info.channels) == (1, 4000, 1)


@pytest.mark.slow
def test_a_small_soak_loses_nothing_and_every_answer_is_the_offline_text(tmp_path: Path) -> None:
    out = tmp_path / "summary.json"
    code = soak.main(["--requests", "40", "--concurrency", "8", "--fault-rate", "0.2", "--model", "tiny.en",
                      "--device", "cpu", "--timeout-s", "120", "--manifest", str(_clips(tmp_path)),
                      "--realtime-rounds", "1", "--json-out", str(out), "--log", str(tmp_path / "server.log")])
    summary = json.loads(out.read_text(encoding="utf-8"))
    assert code == 0 and summary["ok"]
    totals, kinds = summary["totals"], summary["by_kind"]
    assert totals["sent"] == 40 and totals["lost"] == 0 and totals["hung"] == 0
    assert all(kinds[kind]["sent"] >= 1 for kind in FAULT_KINDS)  # 8 faults: every kind at least once
    assert summary["texts"]["checked"] >= 20 and summary["texts"]["equal"] == summary["texts"]["checked"]
    for kind in REFUSED_BODIES:  # refused, or caught by the restart: never answered as if they were speech
        assert kinds[kind]["completed"] == 0
    assert summary["server"]["restart_s"] is not None and summary["server"]["healthy_at_end"]
    realtime = summary["realtime_faults"]
    assert summary["realtime_lost_or_hung"] == [] and set(realtime) == set(REALTIME_FAULTS)
    assert all(r["sent"] == 1 and r["handled"] + r["refused_by_restart"] == 1 for r in realtime.values())
    assert len(summary["server"]["rss_mib_by_quarter"]) == 4
    assert summary["server"]["peak_rss_mib"] > 0


def test_realtime_faults_are_counted_per_kind_and_memory_per_quarter_of_the_run(tmp_path: Path) -> None:
    outcomes = [FaultOutcome("deep_json", "handled", "2 invalid_json errors", 0.0, 1.0),
                FaultOutcome("deep_json", "lost", "ConnectionClosedError", 1.0, 2.0),
                FaultOutcome("header_bomb", "hung", "no answer in time", 2.0, 3.0)]
    rows = summarize_faults(outcomes)
    assert set(rows) == set(REALTIME_FAULTS)
    assert rows["deep_json"] == {"sent": 2, "handled": 1, "refused_by_restart": 0, "lost": 1, "hung": 0,
                                 "details": ["2 invalid_json errors", "ConnectionClosedError"]}
    assert rows["header_bomb"]["hung"] == 1 and rows["session_hog"]["sent"] == 0
    server = SoakServer(ServerOptions("tiny.en", "cpu", 1, 4.0, tmp_path / "log"))
    server.rss_samples = [mib << 20 for mib in (100, 300, 100, 100, 200, 100, 100, 100)]
    assert server.rss_by_quarter() == [{"median": 300.0, "peak": 300.0}, {"median": 100.0, "peak": 100.0},
                                       {"median": 200.0, "peak": 200.0}, {"median": 100.0, "peak": 100.0}]
