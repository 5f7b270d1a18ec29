"""Canary and Cohere Transcribe through the engine's one autoregressive runner: token for token with
transformers' ``generate`` (greedy and beam search), for a batch of different lengths, transcribing and
translating; through the CLI as well."""

from __future__ import annotations

from pathlib import Path

import json

import pytest
import soundfile as sf

from aed_reference import audio_batch, make_canary_checkpoint, make_cohere_checkpoint, reference_generate
from oasr.cli import main
from oasr.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from oasr.engine.engine import ASREngine
from oasr.errors import UnsupportedOptionError
from oasr.models.loader import from_pretrained
from oasr.types import DecodeOptions

MAX_NEW = 20


@pytest.fixture(scope="module", params=["canary", "cohere_asr"])
def checkpoint(request, tmp_path_factory) -> tuple[str, Path]:
    make = make_canary_checkpoint if request.param == "canary" else make_cohere_checkpoint
    return request.param, make(tmp_path_factory.mktemp(request.param))


@pytest.fixture(scope="module")
def loaded(checkpoint):
    return from_pretrained(checkpoint[1], device="cpu", dtype="float32")


def engine_outputs(loaded, audio, options: DecodeOptions, max_num_seqs: int = 8) -> list[list[int]]:
    config = EngineConfig(scheduler=SchedulerConfig(max_num_seqs=max_num_seqs, max_encode_rows=2),
                          cache=CacheConfig(memory_budget_bytes=64 << 20))
    engine = ASREngine(loaded, config)
    out = {o.request_id: o.token_ids for o in engine.run((f"r{i}", a, options) for i, a in enumerate(audio))}
    return [out[f"r{i}"] for i in range(len(audio))]


def translate_options(kind: str) -> DecodeOptions:
    if kind == "canary":
        return DecodeOptions(language="de", task="translate", max_new_tokens=MAX_NEW)
    return DecodeOptions(language="de", punctuation=False, max_new_tokens=MAX_NEW)  # Cohere only transcribes


@pytest.mark.parametrize("beams", [None, 4])
@pytest.mark.parametrize("task", ["transcribe", "translate"])
def test_engine_tokens_equal_transformers_generate(checkpoint, loaded, task: str, beams: int | None) -> None:
    kind, directory = checkpoint
    audio = audio_batch()
    options = DecodeOptions(language="en", max_new_tokens=MAX_NEW) if task == "transcribe" else translate_options(kind)
    options = DecodeOptions(**{**options.__dict__, "beam_size": beams})
    engine = ASREngine(loaded, EngineConfig(cache=CacheConfig(memory_budget_bytes=64 << 20)))
    prompt = engine.runner.prompter.prompt(options, None).token_ids
    expected = reference_generate(directory, audio, prompt, num_beams=beams or 1, max_new_tokens=MAX_NEW)
    assert len({tuple(row) for row in expected}) > 1, "identical rows: the comparison could hardly fail"
    assert engine_outputs(loaded, audio, options) == expected


def test_each_request_holds_cross_attention_for_its_own_length(loaded) -> None:
    """A short clip takes the cross-attention blocks its encoder length needs, not a full window's."""
    engine = ASREngine(loaded, EngineConfig(cache=CacheConfig(memory_budget_bytes=64 << 20)))
    short, long = audio_batch(seconds=(0.5, 4.0))
    for request_id, audio in (("short", short), ("long", long)):
        engine.add_request(audio, DecodeOptions(language="en", min_new_tokens=4, max_new_tokens=4),
                           request_id=request_id)
    engine.step()
    held = {r.request_id: len(r.cross_block_ids) for r in engine.scheduler.running}
    pool = engine.runner.cross_pool
    assert held["short"] == pool.blocks_for(engine.runner.cross_positions(len(short)))
    assert held["short"] < held["long"] < pool.blocks_for(loaded.model.decoder_spec.cross.max_len)
    while engine.has_unfinished():
        engine.step()
    assert pool.num_used == 0


def test_options_the_family_cannot_serve_are_refused_naming_them(checkpoint, loaded) -> None:
    engine = ASREngine(loaded, EngineConfig(cache=CacheConfig(memory_budget_bytes=64 << 20)))
    audio = audio_batch()[0]
    with pytest.raises(UnsupportedOptionError, match="timestamps"):
        engine.add_request(audio, DecodeOptions(language="en", timestamps=True))
    with pytest.raises(UnsupportedOptionError, match="language"):
        engine.add_request(audio, DecodeOptions())
    with pytest.raises(UnsupportedOptionError, match="prompt"):
        engine.add_request(audio, DecodeOptions(language="en", prompt="hello"))


def test_cli_prints_the_generated_tokens_without_prompt_or_end(checkpoint, loaded, tmp_path: Path, capsys) -> None:
    kind, directory = checkpoint
    audio = audio_batch()[0]
    path = tmp_path / "clip.wav"
    sf.write(path, audio, 16_000)
    args = ["transcribe", str(path), "--model", str(directory), "--device", "cpu", "--language", "de",
            "--output-format", "jsonl"]
    if kind == "canary":
        args += ["--target-language", "en"]
    assert main(args) == 0
    row = json.loads(capsys.readouterr().out)
    options = DecodeOptions(language="de", target_language="en" if kind == "canary" else None)
    prompt = ASREngine(loaded, EngineConfig(cache=CacheConfig(memory_budget_bytes=64 << 20))).runner.prompter.prompt(
        options, None).token_ids
    room = loaded.model.decoder_spec.max_positions - len(prompt) + 1
    assert row["token_ids"] == reference_generate(directory, [audio], prompt, max_new_tokens=room)[0]
    assert row["language"] == "de"
