"""scripts/diarization_der.py: its scorer (pyannote.metrics' DER) on turns whose error is known by hand, its
reference turns from a speaker's own track, and a smoke run on the tiny random checkpoint (its DER means
nothing: only the wiring is checked)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from nemotron3_diarization_reference import two_speaker_case

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "diarization_der.py"


@pytest.fixture(scope="module")
def der():
    spec = importlib.util.spec_from_file_location("diarization_der", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


REFERENCE = [(0.0, 4.0, "a"), (4.0, 8.0, "b"), (6.0, 7.0, "a")]  # a speaks again over b for a second


def test_a_reference_scored_against_itself_has_no_error_whatever_the_names(der):
    renamed = [(s, e, {"a": "speaker_1", "b": "speaker_0"}[who]) for s, e, who in REFERENCE]
    scored = der.score(REFERENCE, renamed, collar=0.0, uem=(0.0, 8.0))
    assert scored["der"] == 0.0 and scored["speech_s"] == pytest.approx(9.0)


def test_a_shifted_hypothesis_costs_what_the_shift_leaves_uncovered(der):
    shifted = [(s + 0.5, e + 0.5, who.upper()) for s, e, who in REFERENCE]
    # no collar: [0, 0.5) missed; [4, 4.5) b is heard as a (confusion); [6, 6.5) a missed, [7, 7.5) a false alarm
    exact = der.score(REFERENCE, shifted, collar=0.0, uem=(0.0, 8.0))
    assert (exact["missed_s"], exact["confusion_s"], exact["false_alarm_s"]) == pytest.approx((1.0, 0.5, 0.5))
    assert exact["der"] == pytest.approx(2.0 / 9.0)
    # a 0.25 s collar on each side of every reference boundary (0, 4, 6, 7, 8) forgives half of each error
    collared = der.score(REFERENCE, shifted, collar=0.25, uem=(0.0, 8.0))
    # (speech in the collars: 0.25 at 0, 0.5 at 4, 0.75 at 6 and at 7, 0.25 at 8)
    assert collared["speech_s"] == pytest.approx(9.0 - 2.5)
    assert collared["der"] == pytest.approx(1.0 / 6.5)


def test_a_tracks_turns_bridge_short_gaps_and_drop_short_bursts(der):
    rng = np.random.default_rng(0)
    track = 1e-4 * rng.standard_normal(16000 * 4).astype(np.float32)
    for start, end in ((0.5, 1.5), (1.7, 2.4), (3.0, 3.06)):  # a 0.2 s gap, then a 60 ms click
        track[int(start * 16000) : int(end * 16000)] += 0.3 * np.sin(np.arange(int((end - start) * 16000)) / 5)
    assert der.track_turns(track, "x") == [(0.5, 2.4, "x")]


def test_the_script_scores_both_mixtures(der, tmp_path, capsys):
    checkpoint, _, _ = two_speaker_case(tmp_path)
    assert der.main(["--model", str(checkpoint), "--device", "cpu"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["mixture"], r["num_reference_speakers"]) for r in rows] == [("stereo", 2), ("turns", 3)]
    for row in rows:
        assert row["der"] >= 0 and row["speech_s"] > 0.5 * row["duration_s"]
        assert row["der"] == pytest.approx((row["missed_s"] + row["false_alarm_s"] + row["confusion_s"])
                                           / row["speech_s"])
