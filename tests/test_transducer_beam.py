"""RNN-T beam search on a tiny random Parakeet RNN-T model over shared clips: one beam gives greedy decoding's
tokens, four beams never find a worse alignment than greedy's, and the engine serves it through beam_size."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import oasr
from oasr.decode.hotwords import ContextGraph
from oasr.decode.transducer_beam import transducer_beam_search
from oasr.decode.transducer_greedy import TransducerGreedy
from oasr.errors import UnsupportedOptionError
from oasr.models.loader import from_pretrained
from parakeet_reference import build_reference, write_tokenizer
from speech_data import clips

CLIP_IDS = ("ps_librivox_0880", "ps_librivox_0890", "ps_librivox_0870")


def model_dir(tmp_path_factory, kind: str) -> Path:
    directory = tmp_path_factory.mktemp(f"beam_parakeet_{kind}")
    build_reference(kind).save_pretrained(directory)
    write_tokenizer(directory / "tokenizer.json", "<blank>")
    return directory


@pytest.fixture(scope="module")
def rnnt(tmp_path_factory):
    return from_pretrained(model_dir(tmp_path_factory, "rnnt"), device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def encoded(rnnt):
    audio = [c.audio for c in clips(CLIP_IDS)]
    features, lengths = rnnt.features(audio)
    with torch.inference_mode():
        return audio, rnnt.model.encode(features, lengths)


@pytest.mark.parametrize("max_symbols", [1, 2, 10])
def test_one_beam_gives_the_greedy_tokens(rnnt, encoded, max_symbols) -> None:
    _, out = encoded
    greedy = TransducerGreedy()
    greedy.options = type(greedy.options)(max_symbols_per_step=max_symbols)
    with torch.inference_mode():
        expected = greedy.decode(rnnt.model, out)
        got, _ = transducer_beam_search(rnnt.model, out, beam_size=1, max_symbols=max_symbols)
    assert got == expected
    assert sum(map(len, got)) > 3, "greedy emits (almost) nothing: the comparison could not fail"


def test_four_beams_are_never_less_likely_than_greedy(rnnt, encoded) -> None:
    _, out = encoded
    with torch.inference_mode():
        greedy_ids, greedy_score = transducer_beam_search(rnnt.model, out, beam_size=1, max_symbols=10)
        beam_ids, beam_score = transducer_beam_search(rnnt.model, out, beam_size=4, max_symbols=10)
    assert bool((beam_score >= greedy_score - 1e-4).all()), (beam_score, greedy_score)
    assert beam_ids != greedy_ids, "the beam never left the greedy path: the comparison is weak"


def test_the_engine_decodes_beam_requests_of_a_transducer(rnnt, encoded) -> None:
    audio, out = encoded
    with torch.inference_mode():
        expected, _ = transducer_beam_search(rnnt.model, out, beam_size=4, max_symbols=rnnt.model.max_symbols_per_step)
    results = oasr.transcribe(audio, rnnt, beam_size=4, batch_size=3)
    assert [r.token_ids for r in results] == expected
    with pytest.raises(UnsupportedOptionError, match="option lm"):
        oasr.transcribe(audio[0], rnnt, beam_size=4, lm="x.arpa")


def test_hotwords_raise_a_phrase_s_count_in_the_transducer_beam(rnnt, encoded) -> None:
    audio, out = encoded
    phrase = rnnt.tokenizer.encode("the cat")
    max_symbols = rnnt.model.max_symbols_per_step
    graph = ContextGraph.build([(phrase, 8.0)], rnnt.model.vocab_size)
    with torch.inference_mode():
        plain, _ = transducer_beam_search(rnnt.model, out, 4, max_symbols)
        expected, _ = transducer_beam_search(rnnt.model, out, 4, max_symbols, graph)
    got = [r.token_ids for r in oasr.transcribe(audio, rnnt, beam_size=4, batch_size=3, hotwords="the cat:8")]
    assert got == expected
    assert got != plain, "the boost changed nothing: the comparison could not fail"
    assert phrase_count(got, phrase) > phrase_count(plain, phrase)


def phrase_count(rows: list[list[int]], phrase: list[int]) -> int:
    """How often ``phrase`` occurs in the token rows (overlaps counted)."""
    return sum(sum(row[i:i + len(phrase)] == phrase for i in range(len(row))) for row in rows)
