"""The CTC beam + 3-gram LM bench (oasr.bench.ctc_lm) at a tiny shape on the CPU: its JSON, its sanity fields,
and the 3-gram file it writes."""

from __future__ import annotations

import sys

import pytest

from oasr.bench import ctc_lm

kenlm = pytest.importorskip("kenlm")


def test_the_trigram_file_loads_in_kenlm_and_scores_by_two_words_of_history(tmp_path) -> None:
    words = ctc_lm.lexicon_words(33, 40)
    path = ctc_lm.write_trigram_arpa(tmp_path / "lm.arpa", words, num_sentences=300)
    model = kenlm.Model(str(path))
    assert model.order == 3
    header = path.read_text().split("\n\n")[0]
    assert "ngram 3=" in header and int(header.split("ngram 3=")[1]) > 100
    # Some sentence's score depends on its first word when scoring its third: a real trigram context.
    scores = {(a, b): model.score(f"{a} {words[0]} {b}", bos=False, eos=False) for a in words[:5] for b in words[:5]}
    assert len({round(v, 4) for v in scores.values()}) > 5


def test_the_bench_prints_beam_and_greedy_results_and_skips_a_missing_pyctcdecode(monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "pyctcdecode", None)  # import fails, as on a machine without it
    result = ctc_lm.main(["--arch", "tiny", "--num-utterances", "3", "--device", "cpu", "--num-words", "60",
                          "--num-sentences", "200", "--rounds", "1", "--pyctcdecode-clips", "2",
                          "--beam-size-token", "16", "--beam-threshold", "30"])
    assert set(result) >= {"greedy", "beam_lm", "beam_over_greedy_time", "pyctcdecode", "lm", "audio_seconds"}
    assert result["utterances"] == 3 and result["beam_size"] == 8 and result["lm"]["order"] == 3
    assert result["beam_size_token"] == 16 and result["beam_threshold"] == 30
    assert result["greedy"]["seconds"] > 0 and result["beam_lm"]["seconds"] > 0
    assert result["beam1_equals_greedy"] is True
    assert result["beam_words_in_lexicon"] is True and result["beam_lm"]["words_per_clip"] > 0
    assert "not importable" in result["pyctcdecode"]["skipped"]
    assert '"beam_over_greedy_time"' in capsys.readouterr().out
