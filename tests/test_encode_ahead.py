"""Encode-ahead (``oasr.engine.encode_ahead``): requests encoded while others decode get the same tokens as when
encoded at admission, whether they are admitted in the batch they were encoded in or in another; a request
aborted while its output is held is dropped and nothing else changes. On CPU the ahead pass runs at once (no
second stream), so these tests pin the bookkeeping; the stream's overlap is a GPU matter."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import oasr
from oasr.audio import load_audio
from oasr.engine.config import CacheConfig, EngineConfig, RunnerConfig, SchedulerConfig
from oasr.engine.encode_ahead import gathered
from oasr.engine.engine import ASREngine
from oasr.engine.request import FinishReason
from oasr.models.base import EncoderOutput
from oasr.types import DecodeOptions
from qwen3_reference import audio_batch, make_checkpoint
from speech_data import audio_path, english_short, require_speech_data

# Two decode rows, encode walks of three (one beside decode): admissions take single rows out of ahead batches.
TIGHT = EngineConfig(cache=CacheConfig(memory_budget_bytes=128 << 20),
                     scheduler=SchedulerConfig(max_num_seqs=2, max_encode_rows=3, max_combined_encode_rows=1,
                                               min_combined_encode_rows=1))
OFF = replace(TIGHT, runner=RunnerConfig(encode_ahead=False))


@pytest.fixture(scope="module")
def clips():
    require_speech_data()
    entries = english_short(12.0)[:7]
    return [load_audio(audio_path(e), channel=e.get("channel")) for e in entries]


def run_all(engine: ASREngine, audio, options=None) -> dict[str, list[int]]:
    outputs = engine.run((f"c{i}", a, options or DecodeOptions()) for i, a in enumerate(audio))
    return {o.request_id: o.token_ids for o in outputs}


@pytest.fixture(scope="module")
def reference(tiny_en, clips) -> dict[str, list[int]]:
    return run_all(ASREngine(tiny_en, OFF), clips)


def test_whisper_tokens_are_those_encoded_at_admission(tiny_en, clips, reference) -> None:
    engine = ASREngine(tiny_en, TIGHT)
    assert run_all(engine, clips) == reference
    ahead = engine.runner.ahead
    assert ahead.rows_used > 0, "no request was encoded ahead: the test exercised nothing"
    assert ahead.rows_used == ahead.rows_launched  # first come, first served: nothing encoded ahead is wasted
    assert ahead.num_held == 0


def test_a_request_aborted_while_held_is_dropped_and_the_others_finish_unchanged(tiny_en, clips, reference) -> None:
    engine = ASREngine(tiny_en, TIGHT)
    for i, audio in enumerate(clips):
        engine.add_request(audio, request_id=f"c{i}")
    outputs, aborted, abort_output = {}, None, None
    while engine.has_unfinished():
        for output in engine.step():
            if output.finished:
                outputs[output.request_id] = output.token_ids
        held = [f"c{i}" for i in range(len(clips)) if engine.runner.ahead.holds(f"c{i}")]
        if aborted is None and held:
            aborted = held[-1]
            abort_output = engine.abort(aborted)
    assert aborted is not None and abort_output.finish_reason is FinishReason.ABORTED
    assert abort_output.token_ids == [] and aborted not in outputs
    assert outputs == {k: v for k, v in reference.items() if k != aborted}
    assert engine.runner.ahead.num_held == 0


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    return oasr.from_pretrained(make_checkpoint(tmp_path_factory.mktemp("qwen3_ahead"), seed=1), device="cpu",
                                dtype="float32")


def test_qwen3_variable_length_outputs_are_gathered_across_ahead_batches(qwen3) -> None:
    """Encoder outputs of different lengths, encoded in batches of two and admitted one at a time beside
    decode rows: rows are padded into one batch and each keeps its own frames."""
    audio = audio_batch((0.4, 2.7, 1.0, 7.3, 3.1, 0.9), seed=2)
    options = DecodeOptions(max_new_tokens=12)
    config = replace(TIGHT, cache=CacheConfig(memory_budget_bytes=64 << 20))
    expected = run_all(ASREngine(qwen3, replace(config, runner=RunnerConfig(encode_ahead=False))), audio, options)
    engine = ASREngine(qwen3, config)
    assert run_all(engine, audio, options) == expected
    assert engine.runner.ahead.rows_used > 0


def test_gathered_is_one_pass_as_it_is_or_rows_copied_and_zero_padded() -> None:
    a = EncoderOutput(hidden=torch.randn(2, 5, 3), lengths=torch.tensor([5, 4]))
    b = EncoderOutput(hidden=torch.randn(1, 7, 3), lengths=torch.tensor([7]))
    assert gathered({0: (a, 0), 1: (a, 1)}, None, [], 2) is a
    mixed = gathered({0: (a, 1), 2: (b, 0)}, a, [1], 3)  # row 1 freshly encoded (a's row 0)
    assert mixed.hidden.shape == (3, 7, 3)
    assert mixed.lengths.tolist() == [4, 5, 7]
    assert torch.equal(mixed.hidden[0, :5], a.hidden[1]) and torch.equal(mixed.hidden[1, :5], a.hidden[0])
    assert torch.equal(mixed.hidden[2], b.hidden[0])
    assert not mixed.hidden[0, 5:].any()
