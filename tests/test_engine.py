"""ASREngine with tiny.en on CPU: memory pressure, ticks and aborts never change or lose a result."""

from __future__ import annotations

from dataclasses import replace

import pytest

from oasr.audio import load_audio
from oasr.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from oasr.engine.engine import ASREngine
from oasr.engine.request import FinishReason
from oasr.errors import OASRError, UnsupportedOptionError
from oasr.types import DecodeOptions
from speech_data import audio_path, english_short, require_speech_data

SMALL = EngineConfig(cache=CacheConfig(memory_budget_bytes=256 << 20))


@pytest.fixture(scope="module")
def clips():
    require_speech_data()
    entries = english_short(12.0)[:10]
    return [load_audio(audio_path(e), channel=e.get("channel")) for e in entries]


def run_all(engine: ASREngine, audio) -> dict[str, list[int]]:
    outputs = engine.run((f"c{i}", a, DecodeOptions()) for i, a in enumerate(audio))
    return {o.request_id: o.token_ids for o in outputs}


@pytest.fixture(scope="module")
def reference(tiny_en, clips) -> dict[str, list[int]]:
    return run_all(ASREngine(tiny_en, SMALL), clips)


def test_a_tiny_block_pool_preempts_and_recomputes_without_changing_tokens(tiny_en, clips, reference) -> None:
    # Room for one full-length sequence and a little more: requests must wait and be preempted.
    config = replace(SMALL, cache=replace(SMALL.cache, num_blocks=1 + 28 + 3),
                     scheduler=SchedulerConfig(max_num_seqs=4, starvation_bound=3))
    engine = ASREngine(tiny_en, config)
    peak = 0
    outputs = {}
    for i, audio in enumerate(clips):
        engine.add_request(audio, request_id=f"c{i}")
    while engine.has_unfinished():
        for output in engine.step():
            if output.finished:
                outputs[output.request_id] = output.token_ids
        peak = max(peak, engine.stats().kv_blocks_used)
    assert outputs == reference
    assert peak <= 31
    assert engine.stats().kv_blocks_used == 0


def test_tick_length_and_batch_caps_do_not_change_tokens(tiny_en, clips, reference) -> None:
    config = replace(SMALL, scheduler=SchedulerConfig(decode_steps_per_tick=1, max_encode_rows=3,
                                                      max_combined_encode_rows=1))
    assert run_all(ASREngine(tiny_en, config), clips) == reference


def test_abort_mid_decode_frees_its_rows(tiny_en, clips) -> None:
    engine = ASREngine(tiny_en, SMALL)
    ids = [engine.add_request(a) for a in clips[:3]]
    engine.step()  # encode walk: all three hold a slot and blocks
    assert engine.stats().num_running == 3 and engine.stats().kv_blocks_used > 0
    output = engine.abort(ids[1])
    assert output.finish_reason is FinishReason.ABORTED
    finished = {}
    while engine.has_unfinished():
        finished.update({o.request_id: o for o in engine.step() if o.finished})
    assert set(finished) == {ids[0], ids[2]}
    assert engine.stats().kv_blocks_used == 0 and engine.stats().num_running == 0


def test_fixed_output_length(tiny_en, clips) -> None:
    engine = ASREngine(tiny_en, SMALL)
    options = DecodeOptions(min_new_tokens=32, max_new_tokens=32)
    outputs = list(engine.run([("a", clips[0], options)]))
    assert len(outputs[0].token_ids) == 32 and outputs[0].finish_reason is FinishReason.LENGTH


def test_timings_are_ordered(tiny_en, clips) -> None:
    output = next(ASREngine(tiny_en, SMALL).run([("a", clips[0], DecodeOptions())]))
    t = output.timings
    assert t.queued <= t.encode_start <= t.encode_end <= t.first_token <= t.finished


def test_bad_requests_are_refused_at_the_door(tiny_en, clips) -> None:
    engine = ASREngine(tiny_en, SMALL)
    with pytest.raises(UnsupportedOptionError):
        engine.add_request(clips[0], DecodeOptions(language="fr"))
    with pytest.raises(OASRError, match="window"):
        engine.add_request(clips[0].repeat(10))
    with pytest.raises(OASRError, match="free positions"):
        engine.add_request(clips[0], DecodeOptions(min_new_tokens=500))
    engine.add_request(clips[0], request_id="x")
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request(clips[0], request_id="x")
    assert not engine.scheduler.running


def test_cross_attention_k_v_land_in_each_slot_whether_projected_in_place_or_copied(tiny_en) -> None:
    """Rows in consecutive slots are projected straight into them; others (and a beam's extra slots) through a
    scratch buffer and a word-wise copy. Both must leave each slot holding its own row's K/V."""
    import torch

    from oasr.engine.step import EncodeRow

    engine = ASREngine(tiny_en, EngineConfig(scheduler=SchedulerConfig(max_num_seqs=8)))
    runner, model = engine.runner, tiny_en.model
    torch.manual_seed(0)
    encoded = torch.randn(3, model.config.max_source_positions, model.config.d_model)
    with torch.inference_mode():
        want_k, want_v = model.cross_kv(encoded)  # [layers, B, H, S, D]
        for slots in [((2,), (3,), (4,)), ((6,), (1,), (4, 0))]:  # consecutive; scattered, one row of two beams
            rows = tuple(EncodeRow(f"r{i}", s, tuple(() for _ in s)) for i, s in enumerate(slots))
            lengths = torch.full((3,), model.config.max_source_positions)
            got = runner.cross.write(model, rows, encoded, lengths)
            assert torch.allclose(got.k, want_k, atol=1e-5) and torch.allclose(got.v, want_v, atol=1e-5)
            stored = runner.cross.context(runner.num_slots)
            for i, row in enumerate(rows):
                for slot in row.slots:
                    stored_k, stored_v = stored.k[:, slot], stored.v[:, slot]
                    assert torch.allclose(stored_k, want_k[:, i], atol=1e-5), (slots, slot)
                    assert torch.allclose(stored_v, want_v[:, i], atol=1e-5), (slots, slot)
