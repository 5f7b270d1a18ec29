"""Beam search through the engine, token for token against openai-whisper's ``BeamSearchDecoder`` on the same
weights (tiny.en, fp32 on CPU, temperature 0), beside greedy rows in the same decode walk; beam size 1 through
the beam path against greedy decoding; patience and length penalty as openai-whisper applies them.

openai-whisper (20250625) decodes one window per call here: its batched beam search does not repeat the audio
features per beam and fails for more than one window.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from oasr.engine.aed_beams import BeamRows
from oasr.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from oasr.engine.engine import ASREngine
from oasr.engine.request import FinishReason
from oasr.errors import UnsupportedOptionError
from oasr.types import DecodeOptions
from openai_whisper_reference import openai_whisper_from
from speech_data import clips

whisper = pytest.importorskip("whisper")

# Clips of different sources, voices and formats; on the first of each, tiny.en's beam-5 tokens differ from its
# greedy ones.
PLAIN_IDS = ("coqui_ljspeech_LJ001-0001", "ps_cards_004", "ps_librivox_0870", "fw_stereo_diarization_right",
             "mfa_cold_corpus3")
TIMESTAMP_IDS = ("lhotse_ami_ES2011a_headset_40-46s", "whisper_jfk", "coqui_ljspeech_LJ001-0001")
# 1.6 s where patience 2 and length penalties 0 and 0.5 each change openai-whisper's beam-5 result.
OPTIONS_ID = "ps_cards_004"


@pytest.fixture(scope="module")
def reference(tiny_en):
    return openai_whisper_from(tiny_en)


def openai_decode(reference, features, **options):
    return whisper.decode(reference, features, whisper.DecodingOptions(language="en", fp16=False, **options))


def run(engine: ASREngine, requests) -> dict[str, object]:
    return {o.request_id: o for o in engine.run(requests)}


def test_beam_size_one_goes_through_the_beam_path_and_gives_the_greedy_tokens(tiny_en, monkeypatch) -> None:
    searched: list[str] = []
    first_step = BeamRows.first_step

    def spy(self, tick, *args, **kwargs):
        searched.extend(g.request_id for g in tick.groups)
        return first_step(self, tick, *args, **kwargs)

    monkeypatch.setattr(BeamRows, "first_step", spy)
    short = clips(("whisper_jfk", "coqui_ljspeech_LJ001-0001", "mfa_cold_corpus3"))
    variants = ({"timestamps": True}, {}, {"timestamps": True, "prompt": "Cold, Kennedy."})
    requests = [(f"{c.id}/{kind}", c.audio, DecodeOptions(**options, beam_size=beam))
                for c, options in zip(short, variants, strict=True) for kind, beam in (("greedy", None), ("beam1", 1))]
    outputs = run(ASREngine(tiny_en), requests)
    beam_ids = sorted(r for r, _, _ in requests if r.endswith("/beam1"))
    assert sorted(searched) == beam_ids  # every beam-1 request was searched, no greedy one
    for request_id in beam_ids:
        beam, greedy = outputs[request_id], outputs[request_id.replace("/beam1", "/greedy")]
        assert beam.token_ids == greedy.token_ids, request_id
        assert beam.avg_logprob == pytest.approx(greedy.avg_logprob, abs=1e-4)
        assert beam.finish_reason is greedy.finish_reason is FinishReason.END_OF_TEXT


@pytest.mark.parametrize("timestamps", [False, True])
def test_beam_five_equals_openai_whisper_beside_greedy_rows(tiny_en, reference, timestamps: bool) -> None:
    short = clips(TIMESTAMP_IDS if timestamps else PLAIN_IDS)
    requests = [(f"{c.id}/{kind}", c.audio, DecodeOptions(timestamps=timestamps, beam_size=beam))
                for c in short for kind, beam in (("beam", 5), ("greedy", None))]
    outputs = run(ASREngine(tiny_en), requests)
    features = tiny_en.features([c.audio for c in short])
    greedy = openai_decode(reference, features, without_timestamps=not timestamps)
    for clip, mel, theirs_greedy in zip(short, features, greedy, strict=True):
        theirs = openai_decode(reference, mel, beam_size=5, without_timestamps=not timestamps)
        ours = outputs[f"{clip.id}/beam"]
        assert ours.token_ids == theirs.tokens, clip.id
        assert ours.avg_logprob == pytest.approx(theirs.avg_logprob, abs=1e-3)
        assert ours.no_speech_prob == pytest.approx(theirs.no_speech_prob, abs=1e-4)
        assert outputs[f"{clip.id}/greedy"].token_ids == theirs_greedy.tokens, clip.id
    # The search is not greedy decoding in disguise: on the first clip it finds other tokens.
    assert outputs[f"{short[0].id}/beam"].token_ids != outputs[f"{short[0].id}/greedy"].token_ids


def test_patience_and_length_penalty_equal_openai_whisper(tiny_en, reference) -> None:
    clip = clips((OPTIONS_ID,))[0]
    variants = {"default": {}, "patience 2": {"patience": 2.0}, "length penalty 0.5": {"length_penalty": 0.5},
                "length penalty 0": {"length_penalty": 0.0}, "both": {"patience": 2.0, "length_penalty": 0.5},
                "patience 0.5": {"patience": 0.5}}
    outputs = run(ASREngine(tiny_en), ((name, clip.audio, DecodeOptions(beam_size=5, **options))
                                       for name, options in variants.items()))
    features = tiny_en.features([clip.audio])[0]
    for name, options in variants.items():
        theirs = openai_decode(reference, features, beam_size=5, without_timestamps=True, **options)
        assert outputs[name].token_ids == theirs.tokens, name
        assert outputs[name].avg_logprob == pytest.approx(theirs.avg_logprob, abs=1e-3)
    default = outputs["default"].token_ids
    assert outputs["patience 2"].token_ids != default and outputs["length penalty 0.5"].token_ids != default


def test_searches_of_different_beam_sizes_in_one_walk_give_what_each_gives_alone(tiny_en) -> None:
    short = clips(("ps_cards_004", "coqui_ljspeech_LJ001-0001"))
    sizes = (1, 2, 5)
    together = run(ASREngine(tiny_en), [(f"{c.id}/{k}", c.audio, DecodeOptions(beam_size=k, timestamps=k == 2))
                                        for c in short for k in sizes])
    for k in sizes:
        alone = run(ASREngine(tiny_en), [(f"{c.id}/{k}", c.audio, DecodeOptions(beam_size=k, timestamps=k == 2))
                                         for c in short])
        assert all(alone[r].token_ids == together[r].token_ids for r in alone), k


def test_beam_requests_that_wait_and_are_preempted_give_the_same_tokens(tiny_en) -> None:
    short = clips(("ps_cards_004", "mfa_cold_corpus3", "ps_cards_001"))
    requests = [(f"{c.id}/{beam}", c.audio, DecodeOptions(beam_size=beam)) for c in short for beam in (None, 3)]
    roomy = run(ASREngine(tiny_en, EngineConfig(cache=CacheConfig(memory_budget_bytes=256 << 20))), requests)
    # Four rows for three-beam and greedy requests: a search waits for rows, or takes them from the newest.
    tight = EngineConfig(cache=CacheConfig(memory_budget_bytes=256 << 20),
                         scheduler=SchedulerConfig(max_num_seqs=4, starvation_bound=3, decode_steps_per_tick=3))
    engine = ASREngine(tiny_en, tight)
    preempted: list[str] = []
    preempt = engine.scheduler._preempt
    engine.scheduler._preempt = lambda request: (preempted.append(request.request_id), preempt(request))[1]
    squeezed = run(engine, requests)
    assert {k: v.token_ids for k, v in squeezed.items()} == {k: v.token_ids for k, v in roomy.items()}
    assert any(r.endswith("/3") for r in preempted)  # a search was dropped and recomputed
    assert engine.pool.num_used == 0 and not engine.runner.beams.groups


def test_abort_mid_search_frees_every_row(tiny_en) -> None:
    clip = clips(("whisper_jfk",))[0]
    engine = ASREngine(tiny_en, EngineConfig(cache=CacheConfig(memory_budget_bytes=256 << 20)))
    engine.add_request(clip.audio, DecodeOptions(beam_size=4), request_id="beam")
    engine.add_request(clip.audio, request_id="greedy")
    for _ in range(3):
        assert all(o.request_id == "greedy" for o in engine.step())  # no partial output from a search
    assert engine.stats().kv_blocks_used > 0
    assert engine.abort("beam").finish_reason is FinishReason.ABORTED
    outputs = [o for _ in range(200) if engine.has_unfinished() for o in engine.step() if o.finished]
    assert [o.request_id for o in outputs] == ["greedy"]
    assert engine.stats().kv_blocks_used == 0 and not engine.runner.beams.groups


def test_beam_options_are_checked(tiny_en) -> None:
    for bad in ({"beam_size": 0}, {"beam_size": 2, "patience": 0.0}, {"patience": 2.0}, {"length_penalty": 0.5},
                {"beam_size": 2, "length_penalty": 1.5}, {"beam_size": 2, "temperature": 0.5},
                {"beam_size": 2, "patience": 0.2}):
        with pytest.raises(ValueError):
            DecodeOptions(**bad)
    small = ASREngine(tiny_en, replace(EngineConfig(cache=CacheConfig(memory_budget_bytes=256 << 20)),
                                       scheduler=SchedulerConfig(max_num_seqs=4)))
    with pytest.raises(UnsupportedOptionError, match="decode rows"):
        small.add_request(clips(("whisper_jfk",))[0].audio, DecodeOptions(beam_size=5))
