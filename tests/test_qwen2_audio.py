"""Qwen2-Audio against transformers' ``Qwen2AudioForConditionalGeneration``: a tiny random checkpoint saved with
``save_pretrained``, loaded through ``oasr.from_pretrained`` key for key. On CPU fp32 the features and their
valid-frame counts, the teacher-forced logits and the ASR prompt's ids match transformers' processor and model,
and the engine's greedy tokens (grouped key/value heads and rotary positions through the paged pool) are those of
``generate`` for a batch of different lengths, with the language detected and forced; the detected language is
read from the token the model writes; ``oasr transcribe --output-format jsonl`` prints the tokens and ``oasr
serve`` answers, streaming and not. Each input is featurised on its own (a 30 s window each), so the reference is
``generate`` over each input alone while the engine decodes them together."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import soundfile as sf
import torch
from safetensors.torch import load_file

import oasr
from oasr.cli import main
from oasr.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from oasr.engine.engine import ASREngine
from oasr.errors import UnsupportedOptionError
from oasr.types import DecodeOptions
from qwen2_audio_reference import (
    SAMPLE_RATE,
    audio_batch,
    load_reference,
    make_checkpoint,
    reference_generate,
    reference_inputs,
)

TOLERANCE = 1e-4
MAX_NEW = 24
SECONDS = (0.7, 3.1, 12.0, 29.9)
CLIP = 2.3  # the CLI's and the server's clip: its transcript under the extra end token runs several tokens


@pytest.fixture(scope="module")
def directory(tmp_path_factory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("qwen2_audio"))


@pytest.fixture(scope="module")
def loaded(directory: Path):
    return oasr.from_pretrained(directory, device="cpu", dtype="float32")


def engine_for(loaded) -> ASREngine:
    return ASREngine(loaded, EngineConfig(scheduler=SchedulerConfig(max_num_seqs=8, max_encode_rows=2),
                                          cache=CacheConfig(memory_budget_bytes=64 << 20)))


def test_checkpoint_loads_key_for_key(directory: Path, loaded) -> None:
    assert loaded.architecture == "qwen2_audio"
    ours, theirs = loaded.model.state_dict(), load_file(directory / "model.safetensors")
    assert set(ours) == set(theirs)
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    assert any(k.endswith("self_attn.q_proj.bias") and k.startswith("language_model") for k in ours)  # Qwen2's
    spec = loaded.model.decoder_spec
    assert spec.prompt_audio is not None and spec.num_kv_heads < spec.num_heads


@pytest.mark.parametrize("seconds", [0.7, 12.0, 29.9, 31.0])
def test_features_and_valid_frames_equal_the_processors(directory: Path, loaded, seconds: float) -> None:
    (audio,) = audio_batch((seconds,))
    reference = reference_inputs(directory, audio, "en")
    assert (loaded.features.padded([audio]) - reference["input_features"]).abs().max() < 1e-5
    frames = int(loaded.features.frame_lengths(torch.tensor([len(audio)]))[0])
    assert frames == int(reference["feature_attention_mask"].sum())
    audio_ids = int((reference["input_ids"] == loaded.config.audio_token_index).sum())
    assert loaded.model.encoder_frames(frames) == audio_ids


@torch.no_grad()
def test_teacher_forced_logits_match_the_reference(directory: Path, loaded) -> None:
    """The masked encoder, the pooling and the projector, spliced, and the Qwen2 decoder without a cache."""
    (audio,) = audio_batch((3.1,))
    inputs = reference_inputs(directory, audio, "en")
    ids = torch.cat([inputs["input_ids"], torch.tensor([[97, 98, 99]])], dim=1)
    expected = load_reference(directory)(input_ids=ids, input_features=inputs["input_features"],
                                         feature_attention_mask=inputs["feature_attention_mask"]).logits
    ours = loaded.model(inputs["input_features"], inputs["feature_attention_mask"].sum(-1), ids)
    assert (ours - expected).abs().max() < TOLERANCE
    assert expected.std() > 0.1


@pytest.mark.parametrize("language", [None, "en", "de"])
def test_prompt_ids_equal_the_processors(directory: Path, loaded, language) -> None:
    engine = engine_for(loaded)
    options = DecodeOptions(language=language)
    for seconds in (0.7, 29.9):
        (audio,) = audio_batch((seconds,))
        n = engine.runner.audio_positions(engine.runner.num_frames(len(audio)))
        prompt = engine.runner.prompter.prompt(options, None, n)
        assert list(prompt.token_ids) == reference_inputs(directory, audio, language)["input_ids"][0].tolist()
        assert engine.runner.prompt_len_for(options, len(audio)) == len(prompt.token_ids)


@pytest.mark.parametrize("language", [None, "en"])
def test_engine_tokens_equal_transformers_generate(directory: Path, loaded, language) -> None:
    audio = audio_batch(SECONDS)
    expected = reference_generate(directory, audio, language=language, max_new_tokens=MAX_NEW)
    assert len({tuple(row) for row in expected}) == len(expected), "identical rows: the comparison could hardly fail"
    assert all(len(set(row)) > 2 for row in expected)
    options = DecodeOptions(language=language, max_new_tokens=MAX_NEW)
    outputs = {o.request_id: o for o in engine_for(loaded).run((f"r{i}", a, options) for i, a in enumerate(audio))}
    assert [outputs[f"r{i}"].token_ids for i in range(len(audio))] == expected


def test_detected_language_is_the_token_the_model_writes(loaded) -> None:
    prompter = engine_for(loaded).runner.prompter
    de, text = loaded.tokenizer.token_id("<|de|>"), loaded.tokenizer.encode("guten Tag")
    assert prompter.output_language(None, [de, *text]) == "de"
    assert prompter.output_language("fr", [de, *text]) == "fr"  # a forced language stands
    assert prompter.output_language(None, text) is None
    assert loaded.tokenizer.decode([de, *text]) == "guten Tag"


def test_requests_refuse_what_the_prompt_cannot_say(loaded) -> None:
    engine = engine_for(loaded)
    (audio,) = audio_batch((1.0,))
    for options, match in [(DecodeOptions(language="ja"), "language='ja'"),
                           (DecodeOptions(timestamps=True), "timestamps"),
                           (DecodeOptions(task="translate"), "translate"),
                           (DecodeOptions(prompt="cats"), "prompt")]:
        with pytest.raises(UnsupportedOptionError, match=match):
            engine.add_request(audio, options)


@pytest.fixture(scope="module")
def ending(directory: Path, tmp_path_factory):
    """A copy whose config.json also ends on a token the model writes early: (directory, its end tokens)."""
    (audio,) = audio_batch((CLIP,))
    row = reference_generate(directory, [audio], language="en", max_new_tokens=MAX_NEW)[0]
    stop = next(t for t in row[6:] if t not in row[:6])  # the row then ends after six tokens or more
    return make_checkpoint(tmp_path_factory.mktemp("qwen2_audio_ending"), extra_end=stop), (256, stop)


def test_cli_jsonl_prints_the_generated_tokens(ending, tmp_path: Path, capsys) -> None:
    directory, ends = ending
    (audio,) = audio_batch((CLIP,))
    path = tmp_path / "clip.wav"
    sf.write(path, audio, SAMPLE_RATE, subtype="FLOAT")
    assert main(["transcribe", str(path), "--model", str(directory), "--device", "cpu", "--language", "en",
                 "--output-format", "jsonl"]) == 0
    row = json.loads(capsys.readouterr().out)
    expected = reference_generate(directory, [audio], language="en", max_new_tokens=MAX_NEW, ends=ends)[0]
    assert row["token_ids"] == expected and len(expected) > 2
    assert row["language"] == "en"


def wav(samples) -> bytes:
    buffer = io.BytesIO()
    sf.write(buffer, samples, SAMPLE_RATE, format="WAV", subtype="FLOAT")
    return buffer.getvalue()


def test_serve_answers_streaming_and_not(ending) -> None:
    from openai import OpenAI

    from oasr.serving.app import build_app
    from oasr.serving.settings import ServerSettings
    from serving_harness import WAIT_S, running_server, small_engine

    directory, _ = ending
    (samples,) = audio_batch((CLIP,))
    expected = oasr.transcribe([samples], model=str(directory), device="cpu", dtype="float32", language="en")[0]
    assert expected.text
    engine = small_engine(str(directory), mode="thread")
    try:
        with running_server(build_app(engine, ServerSettings(served_model_name="qwen2-audio"))) as url:
            client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=WAIT_S)
            answer = client.audio.transcriptions.create(file=("a.wav", wav(samples)), model="qwen2-audio",
                                                        language="en")
            assert answer.text == expected.text
            events = list(client.audio.transcriptions.create(file=("a.wav", wav(samples)), model="qwen2-audio",
                                                             language="en", stream=True))
            deltas = [e.delta for e in events if e.type == "transcript.text.delta"]
            assert events[-1].type == "transcript.text.done" and events[-1].text == expected.text
            assert "".join(deltas).strip() == expected.text and len(deltas) > 1
    finally:
        engine.shutdown()
