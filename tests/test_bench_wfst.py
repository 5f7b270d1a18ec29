"""The WFST bench (oasr.bench.wfst) at a tiny shape on the CPU: its JSON, and its parity field, which compares
OASR's search with kaldi-decoder's over the graph the bench builds from its 3-gram LM and lexicon."""

from __future__ import annotations

import pytest

from oasr.bench import wfst

pytest.importorskip("kaldifst")
pytest.importorskip("kaldi_decoder")


def test_the_bench_prints_graph_and_greedy_results_and_matches_kaldi_decoder(capsys) -> None:
    result = wfst.main(["--arch", "tiny", "--num-utterances", "3", "--device", "cpu", "--num-words", "40",
                        "--num-sentences", "200", "--rounds", "1", "--kaldi-clips", "3", "--cpu-workers", "1"])
    assert result["utterances"] == 3 and result["graph"]["states"] > 100 and result["graph"]["arcs"] > 500
    assert result["greedy"]["seconds"] > 0 and result["graph_decode"]["seconds"] > 0
    assert result["search_only"]["clips"] == result["kaldi_decoder"]["clips"] == 3
    assert result["paths_equal_kaldi"] == 1.0
    assert '"graph_over_greedy_time"' in capsys.readouterr().out
