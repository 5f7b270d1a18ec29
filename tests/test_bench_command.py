"""``oasr bench``'s timed runs: each system is timed ``--timed-runs`` times after its warm-up, the fastest
counting, and a count below one is refused."""

from __future__ import annotations

import json

from oasr.cli import main


def test_bench_refuses_fewer_than_one_timed_run(capsys) -> None:
    assert main(["bench", "--model", "tiny.en", "--timed-runs", "0"]) == 2
    assert "--timed-runs must be at least 1, got 0" in capsys.readouterr().err


def test_each_system_is_timed_as_often_as_asked(monkeypatch, capsys) -> None:
    from oasr.bench import peer_transformers
    from oasr.engine.engine import ASREngine

    engine_runs, peer_runs = [], []
    run, peer = ASREngine.run, peer_transformers.run_transformers
    monkeypatch.setattr(ASREngine, "run", lambda self, *a, **k: engine_runs.append(1) or run(self, *a, **k))
    monkeypatch.setattr(peer_transformers, "run_transformers",
                        lambda *a, **k: peer_runs.append(k["batch_size"]) or peer(*a, **k))
    assert main(["bench", "--model", "tiny.en", "--device", "cpu", "--num-utterances", "2", "--max-num-seqs", "2",
                 "--fixed-output-tokens", "3", "--peer", "transformers", "--peer-batch-sizes", "2",
                 "--timed-runs", "3", "--json"]) == 0
    results = json.loads(capsys.readouterr().out)
    assert len(engine_runs) == 1 + 3  # the warm-up, then the timed runs
    assert peer_runs == [2] * (1 + 3)
    assert results["identical_transcripts"] == 1.0
