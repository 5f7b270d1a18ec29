"""Cohere Transcribe against transformers' ``CohereAsrForConditionalGeneration``: a tiny random checkpoint saved
with ``save_pretrained`` (which writes NeMo's key names, as the published checkpoint has them), loaded through
``oasr.from_pretrained``; on CPU fp32 the dithered features, the projected encoder output and the teacher-forced
logits match the reference's within 1e-4, greedy decoding gives its ``generate`` tokens for a batch of different
lengths, and the prompt builder gives the ids of ``CohereAsrProcessor.get_decoder_prompt_ids``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file

import oasr
from aed_reference import (
    AppendCache,
    Pair,
    audio_batch,
    make_cohere_checkpoint,
    make_pair,
    oasr_greedy,
    reference_features,
    reference_generate,
    reference_tokenizer,
)
from oasr.errors import UnsupportedOptionError
from oasr.layers.cache import DenseCross, FullContext
from oasr.models.converters.native import save_native
from oasr.models.loader import build_model, read_checkpoint, resolve_source
from oasr.types import DecodeOptions

TOLERANCE = 1e-4
MAX_NEW_TOKENS = 20


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> Pair:
    return make_pair(make_cohere_checkpoint(tmp_path_factory.mktemp("cohere_asr")), "cohere")


def test_nemo_named_checkpoint_loads_key_for_key(pair: Pair) -> None:
    stored = load_file(str(pair.directory / "model.safetensors"))
    assert any(".first_sub_layer." in k for k in stored)  # the converter's renames are exercised
    assert pair.loaded.architecture == "cohere_asr"
    ours = pair.loaded.model.state_dict()
    theirs = {k.replace(".o_proj.", ".out_proj.") if ".decoder." in k else k: v
              for k, v in pair.reference.state_dict().items()}
    assert set(ours) == set(theirs)
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    model = pair.loaded.model
    assert not torch.equal(model.proj_out.weight, model.model.decoder.embed_tokens.weight)  # untied


def test_dithered_features_match_the_reference_extractor(pair: Pair) -> None:
    assert pair.loaded.features.dither == 1e-5
    audio = audio_batch()
    audio[1][:4000] = 0.0  # digital silence: where the dither decides the log-mel values
    reference, mask = reference_features(pair.directory, audio)
    features, lengths = pair.loaded.features(audio)
    assert torch.equal(lengths, mask.sum(-1))
    assert (features - reference.transpose(1, 2)).abs().max() < TOLERANCE


@torch.no_grad()
def test_projected_encoder_output_matches_the_reference(pair: Pair) -> None:
    reference = pair.reference.model.encoder(pair.x, attention_mask=pair.mask)
    projected = pair.reference.model.decoder.proj(reference.last_hidden_state)
    ours = pair.loaded.model.encode(pair.x.transpose(1, 2), pair.lengths)
    valid = reference.attention_mask.bool()
    width = pair.loaded.config.decoder_config.hidden_size
    assert ours.hidden.shape[-1] == width != reference.last_hidden_state.shape[-1]
    assert torch.equal(ours.lengths, valid.sum(-1))
    assert (ours.hidden - projected)[valid].abs().max() < TOLERANCE


@torch.no_grad()
def test_teacher_forced_logits_match_the_reference(pair: Pair) -> None:
    ids = pair.prompter().prompt_ids(DecodeOptions(language="en"))
    text = torch.randint(20, 48, (len(pair.lengths), 6), generator=torch.Generator().manual_seed(0))
    tokens = torch.cat([torch.tensor([ids] * len(pair.lengths)), text], dim=1)
    reference = pair.reference(input_features=pair.x, attention_mask=pair.mask, decoder_input_ids=tokens).logits
    ours = pair.loaded.model(pair.x.transpose(1, 2), pair.lengths, tokens)
    assert (ours - reference).abs().max() < TOLERANCE


@torch.no_grad()
def test_incremental_decoding_through_a_cache_equals_full_context(pair: Pair) -> None:
    model = pair.loaded.model
    encoded = model.encode(pair.x.transpose(1, 2), pair.lengths)
    cross = DenseCross(*model.cross_kv(encoded.hidden), encoded.lengths)
    tokens = torch.randint(0, 48, (len(pair.lengths), 8), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(tokens.shape[1]).expand_as(tokens)
    full = model.decode_hidden(tokens, positions, FullContext(), cross)
    cache = AppendCache()
    steps = [model.decode_hidden(tokens[:, :4], positions[:, :4], cache, cross)]
    steps += [model.decode_hidden(tokens[:, t : t + 1], positions[:, t : t + 1], cache, cross) for t in range(4, 8)]
    assert (torch.cat(steps, dim=1) - full).abs().max() < 1e-5


def test_greedy_decoding_gives_the_reference_generate_tokens(pair: Pair) -> None:
    builder = pair.prompter()
    ids = builder.prompt_ids(DecodeOptions(language="en"))
    audio = audio_batch()
    reference = reference_generate(pair.directory, audio, ids, num_beams=1, max_new_tokens=MAX_NEW_TOKENS)
    assert len({tuple(r) for r in reference}) == len(reference)
    assert len({t for r in reference for t in r}) > 2
    assert oasr_greedy(pair.loaded, audio, ids, MAX_NEW_TOKENS, builder.end_token) == reference


@pytest.mark.parametrize(("language", "punctuation"), [("en", True), ("de", True), ("fr", False)])
def test_prompt_ids_equal_what_transformers_processor_builds(pair: Pair, language: str, punctuation: bool) -> None:
    processor = transformers.CohereAsrProcessor(
        transformers.AutoFeatureExtractor.from_pretrained(pair.directory), reference_tokenizer(pair.directory)
    )
    expected = processor.get_decoder_prompt_ids(language=language, punctuation=punctuation)
    options = DecodeOptions(language=language, punctuation=punctuation)
    assert pair.prompter().prompt_ids(options) == tuple(expected)
    assert expected[0] == pair.loaded.tokenizer.token_id("\u2581")


def test_prompt_builder_refuses_translation(pair: Pair) -> None:
    builder = pair.prompter()
    builder.check(DecodeOptions(language="de", target_language="de"))  # the same language is transcription
    with pytest.raises(UnsupportedOptionError, match="transcribes only: target_language='en'"):
        builder.check(DecodeOptions(language="de", task="translate"))
    with pytest.raises(UnsupportedOptionError, match="language='zz'"):
        builder.check(DecodeOptions(language="zz"))


def test_native_conversion_keeps_config_and_weights(pair: Pair, tmp_path: Path) -> None:
    """``oasr convert``'s path: the config written as ``to_dict`` and the renamed weights load back unchanged."""
    checkpoint = read_checkpoint(resolve_source(pair.directory))
    config, _ = build_model(checkpoint)
    checkpoint.config = config.to_dict()
    again = oasr.from_pretrained(save_native(checkpoint, tmp_path / "native"), device="cpu", dtype="float32")
    assert again.architecture == "cohere_asr" and again.format == "native"
    assert again.config == pair.loaded.config
    ours, theirs = again.model.state_dict(), pair.loaded.model.state_dict()
    assert set(ours) == set(theirs) and all(torch.equal(ours[k], theirs[k]) for k in theirs)
