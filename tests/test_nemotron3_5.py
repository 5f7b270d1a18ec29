"""Nemotron 3.5 ASR (``Nemotron3_5AsrForRNNT``) served whole-file, against transformers' own classes: a tiny random
checkpoint saved with ``save_pretrained`` (with its processor, whose ``processor_config.json`` holds the language
-> prompt table), loaded through ``oasr.from_pretrained``; the prompt-fused encoder output must equal the
reference's and the engine's greedy tokens must equal transformers' offline ``generate(..., prompt_ids=...)`` for
the default prompt and for a named language, which decode differently."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import oasr
from oasr.cli import main
from oasr.engine.config import EngineConfig, SchedulerConfig
from oasr.engine.engine import ASREngine
from oasr.errors import UnsupportedOptionError
from oasr.models import ARCHITECTURES
from oasr.models.capabilities import capabilities_of
from oasr.models.converters.native import save_native
from oasr.models.loader import read_checkpoint, resolve_source
from oasr.models.nemotron3_5.prompts import DEFAULT_PROMPT_DICTIONARY
from oasr.types import DecodeOptions
from nemotron_reference import (
    JFK,
    Pair,
    build_reference,
    clips,
    make_pair,
    reference_greedy,
)
from parakeet_reference import attention_mask

TOLERANCE = 1e-4
AUTO, GERMAN = DEFAULT_PROMPT_DICTIONARY["auto"], DEFAULT_PROMPT_DICTIONARY["de"]
# Chosen (with the joint calibrated under both prompts) so that "auto" and "de" each decode a varied mix of
# tokens, and differently from each other.
PROMPT_GAIN = 2.5



@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> Pair:
    reference = build_reference("nemotron3_5_asr", prompt_gain=PROMPT_GAIN, calibration_prompts=(AUTO, GERMAN))
    return make_pair(reference, tmp_path_factory.mktemp("nemotron3_5"))


def prompts(prompt_id: int, batch_size: int) -> torch.Tensor:
    return torch.full((batch_size,), prompt_id, dtype=torch.long)


def test_checkpoint_loads_key_for_key(pair: Pair) -> None:
    assert pair.loaded.architecture == "nemotron3_5_asr" and pair.loaded.format == "huggingface"
    ours, theirs = pair.loaded.model.state_dict(), pair.reference.state_dict()
    assert {"prompt_projector.linear_1.weight", "prompt_projector.linear_2.bias"} <= set(theirs)
    assert set(ours) == set(theirs)
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)


def test_config_fields_and_prompt_table_come_from_the_saved_checkpoint(pair: Pair) -> None:
    config, theirs = pair.loaded.config, pair.reference.config
    assert (config.num_prompts, config.prompt_intermediate_size, config.default_prompt_id) == (
        theirs.num_prompts, theirs.prompt_intermediate_size, theirs.default_prompt_id)
    assert config.prompt_dictionary == dict(DEFAULT_PROMPT_DICTIONARY)


def test_a_processor_prompt_table_replaces_the_default(pair: Pair, tmp_path: Path) -> None:
    directory = Path(shutil.copytree(pair.directory, tmp_path / "custom"))
    processor_file = directory / "processor_config.json"
    processor = json.loads(processor_file.read_text())
    processor["prompt_dictionary"] = {"auto": AUTO, "xx-YY": GERMAN}
    processor_file.write_text(json.dumps(processor))
    loaded = oasr.from_pretrained(directory, device="cpu", dtype="float32")
    assert loaded.config.prompt_dictionary == {"auto": AUTO, "xx-YY": GERMAN}
    assert loaded.model.prompt_id(DecodeOptions(language="xx-YY")) == GERMAN
    with pytest.raises(UnsupportedOptionError, match="does not know language 'de'"):
        loaded.model.prompt_id(DecodeOptions(language="de"))


def test_native_round_trip_keeps_the_prompt_fields(pair: Pair, tmp_path: Path) -> None:
    native = oasr.from_pretrained(save_native(read_checkpoint(resolve_source(pair.directory)), tmp_path),
                                  device="cpu", dtype="float32")
    assert native.format == "native" and native.config == pair.loaded.config
    assert native.architecture == "nemotron3_5_asr"


def test_capabilities_serve_the_language_option() -> None:
    record = capabilities_of(ARCHITECTURES.get("nemotron3_5_asr"))
    assert record.runner == "frame_sync" and record.decode_strategies == ("transducer_greedy",)
    assert record.options == frozenset({"language"}) and record.streaming == "cache_aware"


def test_no_language_is_the_default_prompt_and_languages_map_through_the_table(pair: Pair) -> None:
    model = pair.loaded.model
    assert model.prompt_id(DecodeOptions()) == model.prompt_id(DecodeOptions(language="auto")) == AUTO
    assert model.prompt_id(DecodeOptions(language="de")) == model.prompt_id(DecodeOptions(language="de-DE")) == 9


def test_prompt_fused_frames_match_the_reference_per_row(pair: Pair) -> None:
    """Each row of one batch under its own prompt, against ``get_audio_features`` (its ``pooler_output`` is the
    fused frames through ``encoder_projector``)."""
    prompt_ids = torch.tensor([AUTO, GERMAN, DEFAULT_PROMPT_DICTIONARY["fr"]])
    with torch.no_grad():
        theirs = pair.reference.get_audio_features(input_features=pair.x, attention_mask=attention_mask(pair.lengths),
                                                   prompt_ids=prompt_ids)
    model = pair.loaded.model
    with torch.inference_mode():
        encoded = model.encode(pair.x.transpose(1, 2), pair.lengths)
        ours = model.project_encoder(model.fuse_prompt(encoded.hidden, prompt_ids))
        default = model.project_encoder(model.fuse_prompt(encoded.hidden, None))
    real = theirs.attention_mask.bool()
    torch.testing.assert_close(ours[real], theirs.pooler_output[real], rtol=0, atol=TOLERANCE)
    assert torch.equal(default[0], ours[0])  # None is the default prompt, "auto"
    assert not torch.allclose(ours[1], default[1], atol=0.1)  # the prompt moves the frames


@pytest.mark.parametrize("language", [None, "auto", "de"])
def test_engine_tokens_equal_the_reference_offline_generate(pair: Pair, language: str | None) -> None:
    batch_size = len(pair.lengths)
    # No language: generate without prompt_ids (transformers' default prompt) against OASR's default.
    inputs = {} if language is None else {"prompt_ids": prompts(DEFAULT_PROMPT_DICTIONARY[language], batch_size)}
    expected = reference_greedy(pair.reference, pair.x, pair.lengths, **inputs)
    # The comparison could fail: rows differ and each mixes tokens.
    assert len({tuple(row) for row in expected}) == len(expected)
    assert all(len(set(row)) >= 5 for row in expected)
    results = oasr.transcribe(clips(), pair.loaded, batch_size=2, language=language)
    assert [r.token_ids for r in results] == expected
    assert [r.language for r in results] == [language] * batch_size


def test_the_language_changes_the_tokens(pair: Pair) -> None:
    """What lets the parity test above fail on a prompt that is ignored or wrong."""
    batch_size = len(pair.lengths)
    auto = reference_greedy(pair.reference, pair.x, pair.lengths, prompt_ids=prompts(AUTO, batch_size))
    german = reference_greedy(pair.reference, pair.x, pair.lengths, prompt_ids=prompts(GERMAN, batch_size))
    assert all(a != g for a, g in zip(auto, german, strict=True))


def test_rows_of_one_batch_keep_their_own_language(pair: Pair) -> None:
    audio = clips()[:2]
    x, lengths = pair.x[:2], pair.lengths[:2]
    expected = reference_greedy(pair.reference, x, lengths, prompt_ids=torch.tensor([GERMAN, AUTO]))
    engine = ASREngine(pair.loaded, EngineConfig(scheduler=SchedulerConfig(max_encode_rows=2)))
    engine.add_request(audio[0], DecodeOptions(language="de"), request_id="de")
    engine.add_request(audio[1], DecodeOptions(), request_id="auto")
    outputs = {o.request_id: o.token_ids for o in engine.step()}
    assert outputs == {"de": expected[0], "auto": expected[1]}


def test_cli_language_conditions_the_transcript(pair: Pair, capsys) -> None:
    expected = reference_greedy(pair.reference, pair.x[:1], pair.lengths[:1], prompt_ids=prompts(GERMAN, 1))[0]
    assert main(["transcribe", str(JFK), "--model", str(pair.directory), "--device", "cpu", "--language", "de",
                 "--output-format", "jsonl"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["text"] == pair.loaded.tokenizer.decode(expected).strip()


def test_an_unknown_language_is_refused_when_the_request_is_made(pair: Pair) -> None:
    engine = ASREngine(pair.loaded, EngineConfig())
    with pytest.raises(UnsupportedOptionError, match=r"does not know language 'xx-XX'; it knows .*de-DE"):
        engine.add_request(clips()[1], DecodeOptions(language="xx-XX"))
    with pytest.raises(UnsupportedOptionError, match="does not know language 'klingon'"):
        oasr.transcribe(clips()[1], pair.loaded, language="klingon")


def test_models_without_prompts_refuse_the_language_option() -> None:
    """The seam's defaults: Nemotron ASR streaming conditions on nothing and does not serve ``language``."""
    arch = ARCHITECTURES.get("nemotron_asr_streaming")
    model = arch.from_config(arch.tiny_config())
    hidden = torch.randn(2, 5, model.config.encoder_config.hidden_size)
    assert model.prompt_id(DecodeOptions()) is None
    assert model.fuse_prompt(hidden, None) is hidden
    assert "language" not in capabilities_of(arch).options
