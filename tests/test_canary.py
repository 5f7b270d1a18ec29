"""Canary against transformers' ``CanaryForConditionalGeneration``: a tiny random checkpoint saved with
``save_pretrained``, loaded through ``oasr.from_pretrained``; on CPU fp32 the features, encoder output and
teacher-forced logits match the reference's within 1e-4, greedy decoding gives its ``generate`` tokens for a batch
of different lengths, and the prompt builder gives the prompt transformers' processor is pinned to."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import oasr
from aed_reference import (
    LANGUAGES,
    Pair,
    AppendCache,
    audio_batch,
    make_canary_checkpoint,
    make_pair,
    oasr_greedy,
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
    return make_pair(make_canary_checkpoint(tmp_path_factory.mktemp("canary")), "canary")


def hf_prompt(source: str, target: str, pnc: bool = True) -> str:
    """The prompt transformers' Canary chat template renders (pinned in its tests/models/canary/
    test_processing_canary.py, ``_get_prompt``)."""
    return (
        "<|startofcontext|><|startoftranscript|><|emo:undefined|>"
        f"<|{source}|><|{target}|>"
        f"{'<|pnc|>' if pnc else '<|nopnc|>'}<|noitn|><|notimestamp|><|nodiarize|>"
    )


def test_checkpoint_loads_key_for_key(pair: Pair) -> None:
    assert pair.loaded.architecture == "canary" and pair.loaded.format == "huggingface"
    ours = pair.loaded.model.state_dict()
    theirs = {k.replace(".o_proj.", ".out_proj.") if ".decoder." in k else k: v
              for k, v in pair.reference.state_dict().items()}
    assert set(ours) == set(theirs)
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    model = pair.loaded.model
    assert model.proj_out.weight is model.model.decoder.embed_tokens.weight  # tied, as the checkpoint's


def test_sinusoidal_positions_equal_the_reference_table(pair: Pair) -> None:
    positions = torch.arange(pair.loaded.config.decoder_config.max_position_embeddings)
    ours = pair.loaded.model.model.decoder.pos_emb(positions)
    assert torch.equal(ours, pair.reference.model.decoder.pos_emb(positions))


def test_features_match_the_reference_extractor(pair: Pair) -> None:
    features, lengths = pair.loaded.features(audio_batch())
    assert torch.equal(lengths, pair.lengths)
    assert (features - pair.x.transpose(1, 2)).abs().max() < TOLERANCE


@torch.no_grad()
def test_encoder_output_matches_the_reference(pair: Pair) -> None:
    reference = pair.reference.model.encoder(pair.x, attention_mask=pair.mask)
    ours = pair.loaded.model.encode(pair.x.transpose(1, 2), pair.lengths)
    valid = reference.attention_mask.bool()
    assert torch.equal(ours.lengths, valid.sum(-1))
    assert (ours.hidden - reference.last_hidden_state)[valid].abs().max() < TOLERANCE


@torch.no_grad()
def test_teacher_forced_logits_match_the_reference(pair: Pair) -> None:
    prompt = pair.prompter()
    ids = prompt.prompt_ids(DecodeOptions(language="en"))
    text = torch.randint(20, 48, (len(pair.lengths), 6), generator=torch.Generator().manual_seed(0))
    tokens = torch.cat([torch.tensor([ids] * len(pair.lengths)), text], dim=1)
    reference = pair.reference(input_features=pair.x, attention_mask=pair.mask, decoder_input_ids=tokens).logits
    ours = pair.loaded.model(pair.x.transpose(1, 2), pair.lengths, tokens)
    assert ours.dtype == torch.float32 and ours.shape == reference.shape
    assert (ours - reference).abs().max() < TOLERANCE


@torch.no_grad()
def test_cross_kv_into_writes_what_cross_kv_returns(pair: Pair) -> None:
    model = pair.loaded.model
    hidden = model.encode(pair.x.transpose(1, 2), pair.lengths).hidden
    k, v = model.cross_kv(hidden)
    layers, heads, _, head_dim, _ = model.decoder_dims
    b, s, _ = hidden.shape
    k_out, v_out = torch.empty(layers, b, s, heads * head_dim), torch.empty(layers, b, s, heads * head_dim)
    model.cross_kv_into(hidden, k_out, v_out)
    assert torch.equal(k_out.unflatten(-1, (heads, head_dim)).transpose(2, 3), k)
    assert torch.equal(v_out.unflatten(-1, (heads, head_dim)).transpose(2, 3), v)


@torch.no_grad()
def test_incremental_decoding_through_a_cache_equals_full_context(pair: Pair) -> None:
    """The prompt in one call, then one token per call through a growing cache: the engine's pattern."""
    model = pair.loaded.model
    encoded = model.encode(pair.x.transpose(1, 2), pair.lengths)
    cross = DenseCross(*model.cross_kv(encoded.hidden), encoded.lengths)
    tokens = torch.randint(0, 48, (len(pair.lengths), 9), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(tokens.shape[1]).expand_as(tokens)
    full = model.decode_hidden(tokens, positions, FullContext(), cross)
    cache = AppendCache()
    steps = [model.decode_hidden(tokens[:, :5], positions[:, :5], cache, cross)]
    steps += [model.decode_hidden(tokens[:, t : t + 1], positions[:, t : t + 1], cache, cross) for t in range(5, 9)]
    assert (torch.cat(steps, dim=1) - full).abs().max() < 1e-5


def test_greedy_decoding_gives_the_reference_generate_tokens(pair: Pair) -> None:
    builder = pair.prompter()
    ids = builder.prompt_ids(DecodeOptions(language="en"))
    audio = audio_batch()
    reference = reference_generate(pair.directory, audio, ids, num_beams=1, max_new_tokens=MAX_NEW_TOKENS)
    # The reference must be worth matching: rows that differ, more than one token value, not all cut at the limit.
    assert len({tuple(r) for r in reference}) == len(reference)
    assert len({t for r in reference for t in r}) > 2
    assert min(len(r) for r in reference) < MAX_NEW_TOKENS
    assert oasr_greedy(pair.loaded, audio, ids, MAX_NEW_TOKENS, builder.end_token) == reference


@pytest.mark.parametrize(
    ("options", "source", "target", "pnc"),
    [
        (DecodeOptions(language="en"), "en", "en", True),
        (DecodeOptions(language="de", punctuation=False), "de", "de", False),
        (DecodeOptions(language="en", target_language="de"), "en", "de", True),
        (DecodeOptions(language="de", task="translate"), "de", "en", True),
        (DecodeOptions(language="fr", task="translate", target_language="es"), "fr", "es", True),
    ],
)
def test_prompt_ids_equal_what_transformers_builds(pair: Pair, options, source, target, pnc) -> None:
    builder = pair.prompter()
    expected = reference_tokenizer(pair.directory)(hf_prompt(source, target, pnc), add_special_tokens=False)
    assert builder.prompt_ids(options) == tuple(expected["input_ids"])
    assert builder.prompt_len(options) == len(expected["input_ids"])


def test_prompt_builder_names_what_it_refuses(pair: Pair) -> None:
    builder = pair.prompter()
    assert builder.languages == LANGUAGES
    assert builder.end_token == pair.loaded.tokenizer.token_id("<|endoftext|>") == pair.reference.config.eos_token_id
    with pytest.raises(UnsupportedOptionError, match="language='xx'"):
        builder.check(DecodeOptions(language="xx"))
    with pytest.raises(UnsupportedOptionError, match="target_language='ja'"):
        builder.check(DecodeOptions(language="en", target_language="ja"))
    with pytest.raises(UnsupportedOptionError, match="needs language="):
        builder.check(DecodeOptions())
    with pytest.raises(UnsupportedOptionError, match="timestamps"):
        builder.check(DecodeOptions(language="en", timestamps=True))


def test_tokenizer_reads_special_token_names_in_text_as_text(pair: Pair) -> None:
    tokenizer = pair.loaded.tokenizer
    ids = tokenizer.encode("<|en|> the cat")
    assert ids[:7] == [tokenizer.token_id(p) for p in ("\u2581", "<", "|", "e", "n", "|", ">")]
    assert ids[7:] == [tokenizer.token_id("\u2581the"), tokenizer.token_id("\u2581cat")]
    special = [tokenizer.token_id("<|startofcontext|>"), tokenizer.token_id("<|en|>")]
    assert tokenizer.decode(special + tokenizer.encode("the cat")) == "the cat"


def test_native_conversion_keeps_config_and_weights(pair: Pair, tmp_path: Path) -> None:
    """``oasr convert``'s path: the config written as ``to_dict`` and the renamed weights load back unchanged."""
    checkpoint = read_checkpoint(resolve_source(pair.directory))
    config, _ = build_model(checkpoint)
    checkpoint.config = config.to_dict()
    again = oasr.from_pretrained(save_native(checkpoint, tmp_path / "native"), device="cpu", dtype="float32")
    assert again.architecture == "canary" and again.format == "native"
    assert again.config == pair.loaded.config
    ours, theirs = again.model.state_dict(), pair.loaded.model.state_dict()
    assert set(ours) == set(theirs) and all(torch.equal(ours[k], theirs[k]) for k in theirs)


def test_reference_beam_search_returns_generated_tokens_only(pair: Pair) -> None:
    """The helper engine-level beam tests build on: rows hold neither the prompt nor the end token."""
    builder = pair.prompter()
    ids = builder.prompt_ids(DecodeOptions(language="de"))
    rows = reference_generate(pair.directory, audio_batch(), ids, num_beams=4, max_new_tokens=MAX_NEW_TOKENS)
    assert len(rows) == 3 and all(len(r) <= MAX_NEW_TOKENS for r in rows)
    assert all(builder.end_token not in r for r in rows)
    assert rows != reference_generate(pair.directory, audio_batch(), ids, num_beams=1, max_new_tokens=MAX_NEW_TOKENS)
