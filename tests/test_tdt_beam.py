"""TDT beam search on a tiny random Parakeet TDT model over shared clips and seeded random frames: one beam gives
greedy decoding's tokens, four beams never end less likely than greedy's path (also on a model tilted towards
zero-frame durations), the batched search equals a plain one-row frame-synchronous beam, and the engine serves
it through beam_size."""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass

import pytest
import torch

import oasr
from oasr.decode.base import EncoderOutput
from oasr.decode.hotwords import ContextGraph
from oasr.decode.tdt_beam import tdt_beam_search
from oasr.decode.transducer_greedy import TDTGreedy
from oasr.errors import UnsupportedOptionError
from oasr.models.loader import from_pretrained
from parakeet_reference import build_reference, write_tokenizer
from speech_data import clips
from test_transducer_beam import phrase_count

CLIP_IDS = ("ps_librivox_0880", "ps_librivox_0890", "ps_librivox_0870")
SEEDS = (0, 1)
RANDOM_LENGTHS = (60, 41, 17)  # frames per row of a seeded random batch


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
    holds at most max_symbols tokens) decide the paths, and greedy's path is a poor one."""
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


def random_frames(seed: int, width: int) -> EncoderOutput:
    """Seeded encoder outputs at the clips' scale (unit variance), rows of different lengths."""
    hidden = torch.randn(len(RANDOM_LENGTHS), max(RANDOM_LENGTHS), width,
                         generator=torch.Generator().manual_seed(seed))
    return EncoderOutput(hidden, torch.tensor(RANDOM_LENGTHS))


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


@pytest.mark.parametrize("favour_staying", [False, True])
@pytest.mark.parametrize(("frames", "max_symbols"),
                         [("clips", 2), ("clips", 4), *((f"seed {s}", 2) for s in SEEDS)])
def test_four_beams_are_never_less_likely_than_greedy(tdt, stays, encoded, frames, favour_staying,
                                                      max_symbols) -> None:
    """The issue's bar on every row. The label-synchronous search this replaced ended below greedy on two of the
    three clips of the tilted model at max_symbols 2."""
    model = stays if favour_staying else tdt.model
    out = encoded[1] if frames == "clips" else random_frames(int(frames.split()[1]), encoded[1].hidden.shape[2])
    with torch.inference_mode():
        greedy_ids, greedy_score = tdt_beam_search(model, out, beam_size=1, max_symbols=max_symbols)
        beam_ids, beam_score = tdt_beam_search(model, out, beam_size=4, max_symbols=max_symbols)
    assert bool((beam_score >= greedy_score - 1e-4).all()), (beam_score, greedy_score)
    assert beam_ids != greedy_ids, "the beam never left the greedy path: the comparison is weak"
    assert bool((beam_score > greedy_score + 1e-3).any()), "the beam found nothing likelier than greedy's path"


@dataclass(frozen=True)
class _Hyp:
    score: float
    tokens: tuple[int, ...]
    run: int  # tokens emitted on the current frame
    greedy: bool  # greedy decoding's path


def _kept(hyps: list[_Hyp], beam_size: int) -> list[_Hyp]:
    """Greedy's path first (it is never dropped), then the likeliest others, ``beam_size`` in all."""
    return sorted(hyps, key=lambda h: (not h.greedy, -h.score))[:beam_size]


def one_row_beam(model, hidden: torch.Tensor, beam_size: int, max_symbols: int) -> tuple[list[int], float]:
    """The frame-synchronous TDT beam written plainly for one row (hidden [T, D]): per frame a list of
    hypotheses, every (token, duration) spelled out, the predictor run over a hypothesis' tokens."""
    frames = model.project_encoder(hidden[None])[0]
    v, blank, durations = model.vocab_size, model.blank_id, model.durations

    @functools.cache
    def predictor(tokens: tuple[int, ...]):
        if not tokens:
            return model.predictor_init(1, frames.device)
        return model.predictor_step(torch.tensor(tokens[-1:]), predictor(tokens[:-1])[1])

    length = frames.shape[0]
    buckets: dict[int, list[_Hyp]] = {0: [_Hyp(0.0, (), 0, True)]}
    for t in range(length):
        current = buckets.pop(t, [])
        while current:
            staying = []
            for hyp in current:
                logits = model.joint(frames[t][None], predictor(hyp.tokens)[0])[0].float()
                token_lp, duration_lp = logits[:v].log_softmax(-1).tolist(), logits[v:].log_softmax(-1).tolist()
                best_token, best_duration = int(logits[:v].argmax()), durations[int(logits[v:].argmax())]
                for token in range(v):
                    must_move = token == blank or hyp.run + 1 >= max_symbols
                    for i, duration in enumerate(durations):
                        lp = duration_lp[i]
                        if must_move and 0 in durations and 1 in durations:  # one move: the likelier scores it
                            if duration == 0:
                                continue
                            if duration == 1:
                                lp = max(lp, duration_lp[durations.index(0)])
                        greedy = hyp.greedy and token == best_token and (
                            duration == best_duration or (must_move and duration == 1 and best_duration == 0))
                        move = max(duration, 1) if must_move else duration
                        child = _Hyp(hyp.score + token_lp[token] + lp,
                                     hyp.tokens + ((token,) if token != blank else ()),
                                     hyp.run + 1 if move == 0 else 0, greedy)
                        if move == 0:
                            staying.append(child)
                        else:
                            lands = min(t + move, length)
                            buckets[lands] = _kept([*buckets.get(lands, []), child], beam_size)
            current = _kept(staying, beam_size)
    best = max(buckets[length], key=lambda h: h.score)
    return list(best.tokens), best.score


@pytest.mark.parametrize("beam_size", [2, 4])
@pytest.mark.parametrize("favour_staying", [False, True])
def test_the_batched_search_equals_a_plain_one_row_beam(tdt, stays, encoded, beam_size, favour_staying) -> None:
    """Buckets, slots, the lazily fed predictor and the cut of hopeless tokens change nothing against the
    search spelled out per hypothesis (which keeps every token that stays, up to the beam)."""
    model = stays if favour_staying else tdt.model
    out = random_frames(SEEDS[0], encoded[1].hidden.shape[2])
    out = EncoderOutput(out.hidden[:, :20], out.lengths.clamp(max=20) - torch.tensor([0, 5, 12]))
    with torch.inference_mode():
        got_ids, got_score = tdt_beam_search(model, out, beam_size=beam_size, max_symbols=3)
        for row, (ids, score) in enumerate(zip(got_ids, got_score.tolist(), strict=True)):
            expected_ids, expected_score = one_row_beam(model, out.hidden[row, :out.lengths[row]], beam_size, 3)
            assert ids == expected_ids, row
            assert score == pytest.approx(expected_score, abs=1e-4), row
    assert sum(map(len, got_ids)) > 3, "the search emits (almost) nothing: the comparison could not fail"


def test_an_empty_row_gets_no_tokens(tdt) -> None:
    out = EncoderOutput(torch.randn(2, 9, 32, generator=torch.Generator().manual_seed(0)), torch.tensor([9, 0]))
    with torch.inference_mode():
        ids, score = tdt_beam_search(tdt.model, out, beam_size=4, max_symbols=2)
    assert ids[1] == [] and float(score[1]) == 0.0
    assert float(score[0]) < 0.0


def test_the_engine_decodes_beam_requests_of_a_tdt_model(tdt, encoded) -> None:
    audio, out = encoded
    with torch.inference_mode():
        expected, _ = tdt_beam_search(tdt.model, out, beam_size=4, max_symbols=tdt.model.max_symbols_per_step)
    results = oasr.transcribe(audio, tdt, beam_size=4, batch_size=3)
    assert [r.token_ids for r in results] == expected
    with pytest.raises(UnsupportedOptionError, match="option decoding_graph"):  # WFST decoding is CTC's
        oasr.transcribe(audio[0], tdt, decoding_graph="TLG.fst")


def test_hotwords_raise_a_phrase_s_count_in_the_tdt_beam(tdt, encoded) -> None:
    """A boosted phrase is spelled more often, through the engine as by the search; a phrase the rows cannot
    reach changes nothing, tokens or score."""
    audio, out = encoded
    phrase = tdt.tokenizer.encode("the cat")
    max_symbols = tdt.model.max_symbols_per_step
    graph = ContextGraph.build([(phrase, 8.0)], tdt.model.vocab_size)
    with torch.inference_mode():
        plain, plain_score = tdt_beam_search(tdt.model, out, 4, max_symbols)
        expected, _ = tdt_beam_search(tdt.model, out, 4, max_symbols, graph)
        blank = tdt.model.blank_id
        unreachable = ContextGraph.build([((blank, blank), 8.0)], tdt.model.vocab_size)  # never emitted tokens
        same, same_score = tdt_beam_search(tdt.model, out, 4, max_symbols, unreachable)
    got = [r.token_ids for r in oasr.transcribe(audio, tdt, beam_size=4, batch_size=3, hotwords="the cat:8")]
    assert got == expected
    assert got != plain, "the boost changed nothing: the comparison could not fail"
    assert phrase_count(got, phrase) > phrase_count(plain, phrase)
    assert (same, same_score.tolist()) == (plain, plain_score.tolist())
