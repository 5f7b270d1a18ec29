"""Beam search's selection and ranking (``oasr.decode.aed_beam``) against openai-whisper's ``BeamSearchDecoder`` and
``MaximumLikelihoodRanker``, driven by a fake model whose next-token logits depend on the whole sequence so far
(so choosing the wrong source beam shows). CPU, no checkpoint."""

from __future__ import annotations

import math

import pytest
import torch

from oasr.decode import DECODE_STRATEGIES
from oasr.decode.aed_beam import AEDBeam, BeamCandidates, Hypothesis

whisper_decoding = pytest.importorskip("whisper.decoding")

VOCAB = 12
EOT = VOCAB - 1
PROMPT = (7, 3)


def fake_logits(sequence: tuple[int, ...], audio: int) -> torch.Tensor:
    """[VOCAB] float32 logits that depend on the audio and every token so far; end-of-text grows likelier with
    length so hypotheses end at different steps."""
    generator = torch.Generator().manual_seed(hash((audio, *sequence)) % (2**31))
    logits = 2.0 * torch.randn(VOCAB, generator=generator)
    generated = len(sequence) - len(PROMPT)
    # Never end at the first token (Whisper's filters forbid it too), then likelier with every token.
    logits[EOT] = 0.35 * generated - 1.5 + logits[EOT] if generated else float("-inf")
    return logits


class _NoCache:
    def rearrange_kv_cache(self, source_indices) -> None:
        pass


def openai_beam_search(num_audio: int, beam_size: int, patience, length_penalty, max_steps: int):
    """openai-whisper's decoding loop (``DecodingTask._main_loop`` and ``run``) over the fake model, one audio at
    a time: with patience below 1 its result for one audio depends on the rest of its batch (a search that ended
    with fewer than beam_size hypotheses is topped up with live beams from the batch's last step), while OASR's
    searches are independent, as openai-whisper's are for a batch of one."""
    results = []
    for audio in range(num_audio):
        decoder = whisper_decoding.BeamSearchDecoder(beam_size, EOT, _NoCache(), patience)
        tokens = torch.tensor([PROMPT]).repeat_interleave(beam_size, dim=0)
        sum_logprobs = torch.zeros(beam_size)
        for _ in range(max_steps):
            logits = torch.stack([fake_logits(tuple(row.tolist()), audio) for row in tokens])
            tokens, completed = decoder.update(tokens, logits, sum_logprobs)
            if completed:
                break
        candidates, scores = decoder.finalize(tokens[None], sum_logprobs[None])
        candidates = [[t[len(PROMPT) : (t == EOT).nonzero()[0, 0]] for t in s] for s in candidates]
        chosen = whisper_decoding.MaximumLikelihoodRanker(length_penalty).rank(candidates, scores)[0]
        results.append((tuple(candidates[0][chosen].tolist()), scores[0][chosen]))
    return results


def oasr_beam_search(num_audio: int, beam_size: int, patience, length_penalty, max_steps: int):
    """All audios' searches batched through ``AEDBeam.select``; histories kept here, as the runner keeps them
    on the device."""
    beam = AEDBeam(EOT)
    searches = [BeamCandidates(beam_size, patience, length_penalty) for _ in range(num_audio)]
    histories = [[()] for _ in range(num_audio)]  # live beams' generated tokens; one empty beam to start
    scores = torch.zeros(num_audio, 1)
    results: dict[int, Hypothesis] = {}

    def live(a: int) -> list[Hypothesis]:
        return [Hypothesis(h, float(s), ended=False) for h, s in zip(histories[a], scores[a].tolist(), strict=True)]

    for _ in range(max_steps):
        logits = torch.stack([torch.stack([fake_logits(PROMPT + h, a) for h in hs]) for a, hs in enumerate(histories)])
        choice = beam.select(torch.log_softmax(logits, dim=-1), scores, beam_size)
        for a, search in enumerate(searches):
            ended = [Hypothesis(histories[a][s], float(score))
                     for s, score in zip(choice.ended_source[a].tolist(), choice.ended_scores[a].tolist(),
                                         strict=True) if not math.isnan(score)]  # NaN: no more ended
            search.add(ended)
            histories[a] = [histories[a][s] + (t,) for s, t in zip(choice.source[a].tolist(),
                                                                   choice.tokens[a].tolist(), strict=True)]
        scores = choice.scores
        for a, search in enumerate(searches):
            if search.complete and a not in results:  # a search ends at the step its quota fills
                results[a] = search.best(live(a))
    for a, search in enumerate(searches):
        if a not in results:
            results[a] = search.best(live(a))
    return [(results[a].token_ids, results[a].sum_logprob) for a in range(num_audio)]


@pytest.mark.parametrize(("beam_size", "patience", "length_penalty"), [
    (1, None, None), (2, None, None), (5, None, None), (5, 2.0, None), (5, 0.5, None), (4, None, 0.0),
    (5, None, 0.5), (3, 1.5, 1.0),
])
def test_selection_and_ranking_equal_openai_whisper(beam_size: int, patience, length_penalty) -> None:
    for max_steps in (4, 9, 30):  # cut at the budget, or ended by patience
        ours = oasr_beam_search(6, beam_size, patience, length_penalty, max_steps)
        theirs = openai_beam_search(6, beam_size, patience, length_penalty, max_steps)
        assert [t for t, _ in ours] == [t for t, _ in theirs], max_steps
        assert [s for _, s in ours] == pytest.approx([s for _, s in theirs], abs=1e-5)


def test_beam_size_one_is_greedy() -> None:
    for audio in range(5):
        sequence: tuple[int, ...] = ()
        while len(sequence) < 30:
            token = int(fake_logits(PROMPT + sequence, audio).argmax())
            if token == EOT:
                break
            sequence += (token,)
        assert oasr_beam_search(5, 1, None, None, 31)[audio][0] == sequence


def test_patience_and_length_penalty_change_the_result_somewhere() -> None:
    """The parity cases above would pass vacuously if these options never mattered on the fake model."""
    plain = oasr_beam_search(6, 5, None, None, 30)
    assert oasr_beam_search(6, 5, 2.0, None, 30) != plain
    assert oasr_beam_search(6, 5, None, 1.0, 30) != plain


def test_ended_proposals_below_the_last_live_beam_are_dropped() -> None:
    # One beam, K = 2: proposals (ranked) live a, end-of-text, live b -> the end is kept (above the 2nd live);
    # with end-of-text ranked third it falls below the 2nd live beam and is dropped.
    logprobs = torch.log_softmax(torch.tensor([[[3.0, 2.0, 1.0, -5.0] + [-9.0] * (VOCAB - 5) + [2.5]]]), dim=-1)
    choice = AEDBeam(EOT).select(logprobs, torch.zeros(1, 1), 2)
    assert choice.tokens.tolist() == [[0, 1]] and choice.ended_scores[0, 0] == pytest.approx(logprobs[0, 0, EOT])
    logprobs = torch.log_softmax(torch.tensor([[[3.0, 2.0, 1.0, -5.0] + [-9.0] * (VOCAB - 5) + [1.5]]]), dim=-1)
    choice = AEDBeam(EOT).select(logprobs, torch.zeros(1, 1), 2)
    assert choice.tokens.tolist() == [[0, 1]] and torch.isnan(choice.ended_scores).all()


def test_candidates_stop_at_their_quota_and_fill_up_from_live_beams() -> None:
    search = BeamCandidates(beam_size=3, patience=0.5)  # round(1.5) = 2
    search.add([Hypothesis((1,), -1.0), Hypothesis((2,), -2.0), Hypothesis((3,), -0.1)])
    assert search.complete and [h.token_ids for h in search.ended] == [(1,), (2,)]
    # Fewer than beam_size ended: the likeliest live beam joins the ranking.
    live = [Hypothesis((4, 4), -0.5, ended=False), Hypothesis((5, 5), -0.2, ended=False)]
    assert search.best(live) == Hypothesis((5, 5), -0.2, ended=False)
    assert BeamCandidates(2, length_penalty=1.0).best([Hypothesis((1,), -1.2), Hypothesis((1, 2, 3), -1.5)]) \
        .token_ids == (1, 2, 3)


def test_beam_search_is_a_registered_decode_strategy() -> None:
    assert DECODE_STRATEGIES.get("aed_beam") is AEDBeam
