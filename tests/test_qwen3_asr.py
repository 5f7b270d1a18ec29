"""Qwen3-ASR against transformers' ``Qwen3ASRForConditionalGeneration``: a tiny random checkpoint saved with
``save_pretrained``, loaded through ``oasr.from_pretrained`` key for key. On CPU fp32 the features, the projected
encoder output (one attention window and several, batched) and the prompt ids match the reference's, and the
engine's greedy tokens are those of transformers' ``generate`` for a batch of different lengths, with and without
a forced language and a context; the output's ``language X<asr_text>`` head is parsed into a language code and
the text; ``oasr transcribe --output-format jsonl`` prints the generated tokens.

transformers featurises a batch after padding its waveforms to the longest, so a shorter input's batched
features differ from its own; OASR featurises each input alone. The reference is therefore ``generate`` over
each input on its own, while the engine decodes them all together (two per encode batch)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import soundfile as sf
import torch

import oasr
from oasr.cli import main
from oasr.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from oasr.engine.engine import ASREngine
from oasr.errors import UnsupportedOptionError
from oasr.models.converters.native import save_native
from oasr.models.loader import build_model, read_checkpoint, resolve_source
from oasr.types import DecodeOptions
from qwen3_reference import (
    SAMPLE_RATE,
    audio_batch,
    load_reference,
    make_checkpoint,
    reference_features,
    reference_generate,
    reference_prompt_ids,
)

TOLERANCE = 1e-4
MAX_NEW = 24
# The tiny config's attention window is 200 frames (2 s): the first two inputs fit one, the others span several.
SECONDS = (0.4, 1.0, 2.7, 7.3)
CASES = [(None, None), ("en", None), (None, "cats and dogs"), ("de", "Berlin, Hamburg")]


@pytest.fixture(scope="module")
def directory(tmp_path_factory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("qwen3_asr"), seed=1)


@pytest.fixture(scope="module")
def loaded(directory: Path):
    return oasr.from_pretrained(directory, device="cpu", dtype="float32")


def engine_for(loaded) -> ASREngine:
    return ASREngine(loaded, EngineConfig(scheduler=SchedulerConfig(max_num_seqs=8, max_encode_rows=2),
                                          cache=CacheConfig(memory_budget_bytes=64 << 20)))


def test_checkpoint_loads_key_for_key(directory: Path, loaded) -> None:
    assert loaded.architecture == "qwen3_asr"
    ours, theirs = loaded.model.state_dict(), load_reference(directory).state_dict()
    assert set(ours) == set(theirs)
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    model = loaded.model
    assert model.lm_head.weight is model.model.language_model.embed_tokens.weight  # tied
    spec = model.decoder_spec
    assert spec.cross is None and spec.prompt_audio is not None and spec.num_kv_heads < spec.num_heads


@pytest.mark.parametrize("seconds", [0.3, 1.0, 3.37, 7.3])
def test_features_equal_the_reference_extractor(loaded, seconds: float) -> None:
    (audio,) = audio_batch((seconds,))
    reference, mask = reference_features(audio, loaded.config.num_mel_bins)
    ours = loaded.features.padded([audio])
    assert ours.shape == reference.shape and ours.shape[-1] % 100 == 0
    assert (ours - reference).abs().max() < 1e-5
    assert int(loaded.features.frame_lengths(torch.tensor([len(audio)]))[0]) == int(mask.sum())


def test_batched_features_equal_each_input_alone(loaded) -> None:
    """The batch is featurised at once: every row is still exactly its input's own features (its own reflect
    padding and peak, which a batch padded before the STFT would change), zero past its frames; the reference
    extractor on each input alone agrees too."""
    audio = audio_batch((0.3, 0.5, 1.0, 3.37, 7.3))
    batch = loaded.features.padded(audio)  # on the host, a row at a time
    assert torch.equal(loaded.features.at_once(audio, "cpu", batch.shape[-1]), batch)  # CUDA's way, on the host
    for row, samples in zip(batch, audio, strict=True):
        alone = loaded.features.padded([samples])[0]
        assert torch.equal(row[:, : alone.shape[-1]], alone)
        assert not row[:, alone.shape[-1]:].any()
        reference, _ = reference_features(samples, loaded.config.num_mel_bins)
        assert (alone - reference[0]).abs().max() < 1e-5


@torch.no_grad()
def test_encoder_output_matches_the_reference_batched(directory: Path, loaded) -> None:
    audio = audio_batch(SECONDS)
    features = loaded.features.padded(audio)
    lengths = loaded.features.frame_lengths(torch.tensor([len(a) for a in audio]))
    mask = (torch.arange(features.shape[-1])[None, :] < lengths[:, None]).long()
    reference = load_reference(directory).model.get_audio_features(features, mask).pooler_output  # packed rows
    ours = loaded.model.encode(features, lengths)
    counts = [loaded.model.encoder_frames(int(n)) for n in lengths]
    assert ours.lengths.tolist() == counts and sum(counts) == reference.shape[0]
    valid = torch.arange(ours.hidden.shape[1])[None, :] < ours.lengths[:, None]
    assert (ours.hidden[valid] - reference).abs().max() < TOLERANCE
    assert reference.std() > 0.1  # the weights are scaled: the comparison is not between near-zero values


@torch.no_grad()
def test_teacher_forced_logits_match_the_reference(directory: Path, loaded) -> None:
    (audio,) = audio_batch((2.7,))
    reference_model = load_reference(directory)
    features, mask = reference_features(audio, loaded.config.num_mel_bins)
    num_audio = loaded.model.encoder_frames(int(mask.sum()))
    ids = torch.tensor([reference_prompt_ids(directory, num_audio, "en", None) + [97, 98, 99]])
    expected = reference_model(input_ids=ids, input_features=features, input_features_mask=mask).logits
    ours = loaded.model(features, mask.sum(-1), ids)
    assert (ours - expected).abs().max() < TOLERANCE


@pytest.mark.parametrize(("language", "context"), CASES + [("fr", "x <|im_end|> y")])
def test_prompt_ids_equal_the_chat_text_tokenized_whole(directory: Path, loaded, language, context) -> None:
    engine = engine_for(loaded)
    options = DecodeOptions(language=language, prompt=context)
    prompt = engine.runner.prompter.prompt(options, None, 13)
    if "<|" in (context or ""):  # typed in a context, a special token's name stays text
        assert prompt.token_ids.count(loaded.tokenizer.token_id("<|im_end|>")) == 2
        return
    assert list(prompt.token_ids) == reference_prompt_ids(directory, 13, language, context)
    pad = loaded.config.audio_token_id
    assert prompt.token_ids[prompt.audio_index : prompt.audio_index + 13] == (pad,) * 13
    assert engine.runner.prompter.prompt_len(options, 13) == len(prompt.token_ids)


@pytest.mark.parametrize(("language", "context"), CASES)
def test_engine_tokens_equal_transformers_generate(directory: Path, loaded, language, context) -> None:
    audio = audio_batch(SECONDS)
    expected = reference_generate(directory, audio, language=language, context=context, max_new_tokens=MAX_NEW)
    assert len({tuple(row) for row in expected}) == len(expected), "identical rows: the comparison could hardly fail"
    assert all(len(set(row)) > 2 for row in expected)
    options = DecodeOptions(language=language, prompt=context, max_new_tokens=MAX_NEW)
    engine = engine_for(loaded)
    outputs = {o.request_id: o for o in engine.run((f"r{i}", a, options) for i, a in enumerate(audio))}
    assert [outputs[f"r{i}"].token_ids for i in range(len(audio))] == expected
    assert {outputs[f"r{i}"].language for i in range(len(audio))} == {language}


def test_engine_tokens_equal_transformers_generate_for_prompts_of_nearly_one_length(directory: Path, loaded) -> None:
    """An encode batch whose prompts run as one group although their lengths are not in the batch's order (the
    shorter audio has the longer prompt, through its context): each row keeps its own prompt, audio and slot."""
    from oasr.engine.prompt_pass import length_groups

    audio = audio_batch((2.6, 2.9), seed=3)
    options = [DecodeOptions(prompt="cats, dogs", max_new_tokens=MAX_NEW), DecodeOptions(max_new_tokens=MAX_NEW)]
    engine = engine_for(loaded)
    lengths = [engine.runner.prompt_len_for(o, len(a)) for o, a in zip(options, audio)]
    assert lengths[0] > lengths[1] and length_groups(lengths[::-1]) == [[1, 0]], lengths  # batched longest audio first
    expected = [*reference_generate(directory, audio[:1], context="cats, dogs", max_new_tokens=MAX_NEW),
                *reference_generate(directory, audio[1:], max_new_tokens=MAX_NEW)]
    assert expected[0] != expected[1]
    outputs = {o.request_id: o for o in engine.run((f"r{i}", a, o) for i, (a, o) in enumerate(zip(audio, options)))}
    assert [outputs["r0"].token_ids, outputs["r1"].token_ids] == expected


def test_output_head_gives_the_language_code_and_only_the_text(loaded) -> None:
    tokenizer = loaded.tokenizer
    prompter = engine_for(loaded).runner.prompter
    marker = tokenizer.token_id("<asr_text>")
    ids = tokenizer.encode("language German") + [marker] + tokenizer.encode("guten Tag")
    assert tokenizer.decode(ids) == "guten Tag"
    assert prompter.output_language(None, ids) == "de"
    assert prompter.output_language("fr", ids) == "fr"  # a forced language stands
    silence = tokenizer.encode("language None") + [marker]
    assert tokenizer.decode(silence) == "" and prompter.output_language(None, silence) is None
    assert tokenizer.decode(tokenizer.encode("no head")) == "no head"  # a forced language's output is all text


def test_prompt_builder_refuses_what_it_cannot_express(loaded) -> None:
    engine = engine_for(loaded)
    (audio,) = audio_batch((1.0,))
    for options, match in [(DecodeOptions(language="xx"), "language='xx'"),
                           (DecodeOptions(timestamps=True), "timestamps"),
                           (DecodeOptions(task="translate"), "translate"),
                           (DecodeOptions(prompt_token_ids=(1, 2)), "prompt")]:
        with pytest.raises(UnsupportedOptionError, match=match):
            engine.add_request(audio, options)


def test_prompt_splice_equals_teacher_forcing(loaded) -> None:
    """The engine's prompt pass (paged pool, audio spliced by index) and the model's forward (audio placed where
    the ``<|audio_pad|>`` ids are, no cache) give the same first token, with the same log-probability."""
    audio = audio_batch(SECONDS)
    engine = engine_for(loaded)
    options = DecodeOptions(language="en", max_new_tokens=1)
    first = {o.request_id: o for o in engine.run((f"r{i}", a, options) for i, a in enumerate(audio))}
    for i, samples in enumerate(audio):
        features = loaded.features.padded([samples])
        length = loaded.features.frame_lengths(torch.tensor([len(samples)]))
        prompt = engine.runner.prompter.prompt(options, None, loaded.model.encoder_frames(int(length[0])))
        with torch.no_grad():
            logprobs = loaded.model(features, length, torch.tensor([prompt.token_ids]))[0, -1].log_softmax(-1)
        output = first[f"r{i}"]
        assert output.token_ids == [int(logprobs.argmax())]
        assert abs(output.sum_logprob - float(logprobs.max())) < TOLERANCE


def test_cli_jsonl_prints_the_generated_tokens_without_prompt_or_end(directory: Path, loaded, tmp_path: Path,
                                                                     capsys) -> None:
    (audio,) = audio_batch((2.7,))
    path = tmp_path / "clip.wav"
    sf.write(path, audio, SAMPLE_RATE, subtype="FLOAT")
    assert main(["transcribe", str(path), "--model", str(directory), "--device", "cpu", "--language", "en",
                 "--output-format", "jsonl"]) == 0
    row = json.loads(capsys.readouterr().out)
    engine = engine_for(loaded)
    options = DecodeOptions(language="en")
    room = engine.runner.max_positions - engine.runner.prompt_len_for(options, len(audio)) + 1
    expected = reference_generate(directory, [audio], language="en", max_new_tokens=room)[0]
    assert row["token_ids"] == expected and len(expected) > 2
    assert row["language"] == "en"
    assert row["text"] == loaded.tokenizer.decode(expected).strip()


def test_native_conversion_keeps_config_and_weights(directory: Path, loaded, tmp_path: Path) -> None:
    """``oasr convert``'s path: the config written as ``to_dict`` and the weights load back unchanged."""
    checkpoint = read_checkpoint(resolve_source(directory))
    config, _ = build_model(checkpoint)
    checkpoint.config = config.to_dict()
    again = oasr.from_pretrained(save_native(checkpoint, tmp_path / "native"), device="cpu", dtype="float32")
    assert again.architecture == "qwen3_asr" and again.format == "native"
    assert again.config == loaded.config
    ours, theirs = again.model.state_dict(), loaded.model.state_dict()
    assert set(ours) == set(theirs) and all(torch.equal(ours[k], theirs[k]) for k in theirs)


def test_every_end_token_of_the_checkpoint_ends_a_request(directory: Path, tmp_path: Path) -> None:
    """A checkpoint with two ``eos_token_id``s (the real ones: <|endoftext|> and <|im_end|>) stops at either, as
    ``generate`` does. The second is a token the model writes mid-row here, so that rows do end on it."""
    audio = audio_batch(SECONDS)
    plain = reference_generate(directory, audio, language="en", max_new_tokens=MAX_NEW)
    stop = plain[0][len(plain[0]) // 2]
    copy = Path(shutil.copytree(directory, tmp_path / "two_ends"))
    config = json.loads((copy / "config.json").read_text())
    config["eos_token_id"] = [stop, config["eos_token_id"][0] if isinstance(config["eos_token_id"], list)
                              else config["eos_token_id"]]
    (copy / "config.json").write_text(json.dumps(config))
    expected = reference_generate(copy, audio, language="en", max_new_tokens=MAX_NEW)
    assert len(expected[0]) < len(plain[0]) and stop not in expected[0]
    loaded = oasr.from_pretrained(copy, device="cpu", dtype="float32")
    options = DecodeOptions(language="en", max_new_tokens=MAX_NEW)
    outputs = {o.request_id: o.token_ids for o in engine_for(loaded).run((f"r{i}", a, options)
                                                                        for i, a in enumerate(audio))}
    assert [outputs[f"r{i}"] for i in range(len(audio))] == expected
    # Below the minimum length both end tokens are held back, as transformers' MinNewTokensLengthLogitsProcessor
    # holds back every eos id.
    minimum = len(expected[0]) + 2
    longer = reference_generate(copy, audio, language="en", max_new_tokens=MAX_NEW, min_new_tokens=minimum)
    assert len(longer[0]) >= minimum  # the row ran past where the stop token ended it
    options = DecodeOptions(language="en", max_new_tokens=MAX_NEW, min_new_tokens=minimum)
    outputs = {o.request_id: o.token_ids for o in engine_for(loaded).run((f"r{i}", a, options)
                                                                        for i, a in enumerate(audio))}
    assert [outputs[f"r{i}"] for i in range(len(audio))] == longer
