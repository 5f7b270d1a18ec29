"""A small soak of a real ``oasr serve`` subprocess: faults, a restart, and answers equal to the offline text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import oasr
from oasr.bench import soak
from oasr.bench.soak_faults import FAULT_KINDS, REFUSED_BODIES

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


@pytest.mark.slow
def test_a_small_soak_loses_nothing_and_every_answer_is_the_offline_text(tmp_path: Path) -> None:
    out = tmp_path / "summary.json"
    code = soak.main(["--requests", "40", "--concurrency", "8", "--fault-rate", "0.2", "--model", "tiny.en",
                      "--device", "cpu", "--timeout-s", "120", "--manifest", str(_clips(tmp_path)),
                      "--json-out", str(out), "--log", str(tmp_path / "server.log")])
    summary = json.loads(out.read_text(encoding="utf-8"))
    assert code == 0 and summary["ok"]
    totals, kinds = summary["totals"], summary["by_kind"]
    assert totals["sent"] == 40 and totals["lost"] == 0 and totals["hung"] == 0
    assert all(kinds[kind]["sent"] >= 1 for kind in FAULT_KINDS)  # 8 faults: every kind at least once
    assert summary["texts"]["checked"] >= 20 and summary["texts"]["equal"] == summary["texts"]["checked"]
    for kind in REFUSED_BODIES:  # refused, or caught by the restart: never answered as if they were speech
        assert kinds[kind]["completed"] == 0
    assert summary["server"]["restart_s"] is not None and summary["server"]["healthy_at_end"]
    assert summary["server"]["peak_rss_mib"] > 0
