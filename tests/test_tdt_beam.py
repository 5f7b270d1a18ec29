"""TDT beam search on a tiny random Parakeet TDT model over shared clips: one beam gives greedy decoding's
tokens, four beams never end less likely than greedy's path, and the engine serves it through beam_size."""

from __future__ import annotations

import copy

import pytest
import torch

import oasr
from oasr.decode.tdt_beam import tdt_beam_search
from oasr.decode.transducer_greedy import TDTGreedy
from oasr.errors import UnsupportedOptionError
from oasr.models.loader import from_pretrained
from parakeet_reference import build_reference, write_tokenizer
from speech_data import clips

CLIP_IDS = ("ps_librivox_0880", "ps_librivox_0890", "ps_librivox_0870")


@pytest.fixture(scope="module")
def tdt(tmp_path_factory):
    directory = tmp_path_factory.mktemp("beam_parakeet_tdt")
    build_reference("tdt").save_pretrained(directory)
    write_tokenizer(directory / "tokenizer.json", "<blank>")
    return from_pretrained(directory, device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def stays(tdt):
    """The same model with the zero-frame duration favoured (the reference penalises it): blanks and tokens
    that would stay on their frame are frequent, so greedy's rules for them (a blank moves one frame; a frame
    holds at most max_symbols tokens) decide the paths."""
    model = copy.deepcopy(tdt.model)
    with torch.no_grad():
        model.joint.head.bias[model.vocab_size] += 6.0
    return model


@pytest.fixture(scope="module")
def encoded(tdt):
    audio = [c.audio for c in clips(CLIP_IDS)]
    features, lengths = tdt.features(audio)
    with torch.inference_mode():
        return audio, tdt.model.encode(features, lengths)


@pytest.mark.parametrize("max_symbols", [1, 2, 10])
@pytest.mark.parametrize("favour_staying", [False, True])
def test_one_beam_gives_the_greedy_tokens(tdt, stays, encoded, max_symbols, favour_staying) -> None:
    _, out = encoded
    model = stays if favour_staying else tdt.model
    greedy = TDTGreedy()
    greedy.options = type(greedy.options)(max_symbols_per_step=max_symbols)
    with torch.inference_mode():
        expected = greedy.decode(model, out)
        got, _ = tdt_beam_search(model, out, beam_size=1, max_symbols=max_symbols)
    assert got == expected
    assert sum(map(len, got)) > 3, "greedy emits (almost) nothing: the comparison could not fail"


@pytest.mark.parametrize("max_symbols", [2, 10])
def test_four_beams_are_never_less_likely_than_greedy(tdt, encoded, max_symbols) -> None:
    """On the calibrated model. Not a guarantee of the search (hypotheses on different frames are ranked by
    their scores after equally many decisions): with zero-frame durations favoured (``stays``) four beams
    ended below greedy on two of the three clips; docs/decoding.md says so."""
    _, out = encoded
    with torch.inference_mode():
        greedy_ids, greedy_score = tdt_beam_search(tdt.model, out, beam_size=1, max_symbols=max_symbols)
        beam_ids, beam_score = tdt_beam_search(tdt.model, out, beam_size=4, max_symbols=max_symbols)
    assert bool((beam_score >= greedy_score - 1e-4).all()), (beam_score, greedy_score)
    assert beam_ids != greedy_ids, "the beam never left the greedy path: the comparison is weak"


def test_the_engine_decodes_beam_requests_of_a_tdt_model(tdt, encoded) -> None:
    audio, out = encoded
    with torch.inference_mode():
        expected, _ = tdt_beam_search(tdt.model, out, beam_size=4, max_symbols=tdt.model.max_symbols_per_step)
    results = oasr.transcribe(audio, tdt, beam_size=4, batch_size=3)
    assert [r.token_ids for r in results] == expected
    with pytest.raises(UnsupportedOptionError, match="option hotwords"):
        oasr.transcribe(audio[0], tdt, beam_size=4, hotwords="the cat")
    with pytest.raises(UnsupportedOptionError, match="option decoding_graph"):  # WFST decoding is CTC's
        oasr.transcribe(audio[0], tdt, decoding_graph="TLG.fst")
