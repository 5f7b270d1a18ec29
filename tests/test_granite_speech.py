"""Granite Speech against transformers' ``GraniteSpeechForConditionalGeneration``: a tiny random checkpoint saved
with ``save_pretrained``, loaded through ``oasr.from_pretrained`` key for key. On CPU fp32 the stacked log-mel
features and their audio-position counts, the conformer + Q-Former output (a batch of different lengths, each row
as its input alone), the teacher-forced logits (Granite's four scales) and the chat prompt's ids match
transformers' processor and model, and the engine's greedy tokens are those of ``generate`` for a batch of
different lengths; ``oasr transcribe --output-format jsonl`` prints them and ``oasr serve`` answers, streaming and
not. (Audio over 30 s is cut by the transcription driver, as for Qwen2-Audio.)"""

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
from oasr.errors import OASRError, UnsupportedOptionError
from oasr.types import DecodeOptions
from granite_speech_reference import (
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
CLIP = 5.3  # the CLI's and the server's clip: its transcript under the extra end token runs several tokens


@pytest.fixture(scope="module")
def directory(tmp_path_factory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("granite_speech"))


@pytest.fixture(scope="module")
def loaded(directory: Path):
    return oasr.from_pretrained(directory, device="cpu", dtype="float32")


def engine_for(loaded) -> ASREngine:
    return ASREngine(loaded, EngineConfig(scheduler=SchedulerConfig(max_num_seqs=8, max_encode_rows=2),
                                          cache=CacheConfig(memory_budget_bytes=64 << 20)))


def test_checkpoint_loads_key_for_key(directory: Path, loaded) -> None:
    assert loaded.architecture == "granite_speech"
    ours, theirs = loaded.model.state_dict(), load_file(directory / "model.safetensors")
    assert set(ours) - set(theirs) == {"language_model.lm_head.weight"}  # tied to the embeddings, not stored
    assert set(theirs) <= set(ours) and all(torch.equal(ours[k], theirs[k]) for k in theirs)
    model = loaded.model
    assert model.language_model.lm_head.weight is model.language_model.model.embed_tokens.weight


def test_a_checkpoint_with_a_lora_adapter_is_refused(directory: Path, tmp_path: Path) -> None:
    import shutil

    copy = Path(shutil.copytree(directory, tmp_path / "lora"))
    values = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**values, "has_lora_adapter": True}))
    with pytest.raises((OASRError, ValueError), match="has_lora_adapter"):
        oasr.from_pretrained(copy, device="cpu")


@pytest.mark.parametrize("seconds", [0.7, 3.1, 12.0])
def test_features_and_audio_positions_equal_the_processors(directory: Path, loaded, seconds: float) -> None:
    (audio,) = audio_batch((seconds,))
    reference = reference_inputs(directory, audio)
    ours = loaded.features.padded([audio]).transpose(1, 2)
    assert ours.shape == reference["input_features"].shape
    assert (ours - reference["input_features"]).abs().max() < 1e-4
    frames = int(loaded.features.frame_lengths(torch.tensor([len(audio)]))[0])
    assert loaded.model.encoder_frames(frames) == int(reference["input_features_mask"].sum())
    assert loaded.model.encoder_frames(frames) == int((reference["input_ids"] == 259).sum())


@torch.no_grad()
def test_audio_embeddings_match_the_reference_batched(directory: Path, loaded) -> None:
    audio = audio_batch(SECONDS)
    features = loaded.features.padded(audio)
    lengths = loaded.features.frame_lengths(torch.tensor([len(a) for a in audio]))
    ours = loaded.model.encode(features, lengths)
    reference_model = load_reference(directory)
    for row, samples in enumerate(audio):
        expected = reference_model.get_audio_features(reference_inputs(directory, samples)["input_features"])
        expected = expected.pooler_output[0]
        assert int(ours.lengths[row]) == expected.shape[0]
        assert (ours.hidden[row, : expected.shape[0]] - expected).abs().max() < TOLERANCE
        assert expected.std() > 0.1


@torch.no_grad()
def test_teacher_forced_logits_match_the_reference(directory: Path, loaded) -> None:
    (audio,) = audio_batch((3.1,))
    inputs = reference_inputs(directory, audio)
    ids = torch.cat([inputs["input_ids"], torch.tensor([[97, 98, 99]])], dim=1)
    expected = load_reference(directory)(input_ids=ids, input_features=inputs["input_features"]).logits
    lengths = loaded.features.frame_lengths(torch.tensor([len(audio)]))
    ours = loaded.model(inputs["input_features"].transpose(1, 2), lengths, ids)
    assert (ours - expected).abs().max() < TOLERANCE


def test_prompt_ids_equal_the_processors(directory: Path, loaded) -> None:
    engine = engine_for(loaded)
    for seconds in (0.7, 12.0):
        (audio,) = audio_batch((seconds,))
        n = engine.runner.audio_positions(engine.runner.num_frames(len(audio)))
        prompt = engine.runner.prompter.prompt(DecodeOptions(), None, n)
        assert list(prompt.token_ids) == reference_inputs(directory, audio)["input_ids"][0].tolist()
        assert engine.runner.prompt_len_for(DecodeOptions(), len(audio)) == len(prompt.token_ids)


def test_engine_tokens_equal_transformers_generate(directory: Path, loaded) -> None:
    audio = audio_batch(SECONDS)
    expected = reference_generate(directory, audio, max_new_tokens=MAX_NEW)
    assert len({tuple(row) for row in expected}) == len(expected), "identical rows: the comparison could hardly fail"
    assert all(len(set(row)) > 2 for row in expected)
    options = DecodeOptions(max_new_tokens=MAX_NEW)
    outputs = {o.request_id: o for o in engine_for(loaded).run((f"r{i}", a, options) for i, a in enumerate(audio))}
    assert [outputs[f"r{i}"].token_ids for i in range(len(audio))] == expected


def test_requests_refuse_what_the_prompt_cannot_say(loaded) -> None:
    engine = engine_for(loaded)
    (audio,) = audio_batch((1.0,))
    for options, match in [(DecodeOptions(language="en"), "language"),
                           (DecodeOptions(timestamps=True), "timestamps"),
                           (DecodeOptions(task="translate"), "translate"),
                           (DecodeOptions(prompt="cats"), "prompt")]:
        with pytest.raises(UnsupportedOptionError, match=match):
            engine.add_request(audio, options)


@pytest.fixture(scope="module")
def ending(directory: Path, tmp_path_factory):
    """A copy whose config.json also ends on a token the model writes early: (directory, its end tokens)."""
    (audio,) = audio_batch((CLIP,))
    row = reference_generate(directory, [audio], max_new_tokens=MAX_NEW)[0]
    stop = next(t for t in row[6:] if t not in row[:6])  # the row then ends after six tokens or more
    return make_checkpoint(tmp_path_factory.mktemp("granite_ending"), extra_end=stop), (256, stop)


def test_cli_jsonl_prints_the_generated_tokens(ending, tmp_path: Path, capsys) -> None:
    directory, ends = ending
    (audio,) = audio_batch((CLIP,))
    path = tmp_path / "clip.wav"
    sf.write(path, audio, SAMPLE_RATE, subtype="FLOAT")
    assert main(["transcribe", str(path), "--model", str(directory), "--device", "cpu",
                 "--output-format", "jsonl"]) == 0
    row = json.loads(capsys.readouterr().out)
    expected = reference_generate(directory, [audio], max_new_tokens=MAX_NEW, ends=ends)[0]
    assert row["token_ids"] == expected and len(expected) > 2


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
    expected = oasr.transcribe([samples], model=str(directory), device="cpu", dtype="float32")[0]
    assert expected.text
    engine = small_engine(str(directory), mode="thread")
    try:
        with running_server(build_app(engine, ServerSettings(served_model_name="granite"))) as url:
            client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=WAIT_S)
            answer = client.audio.transcriptions.create(file=("a.wav", wav(samples)), model="granite")
            assert answer.text == expected.text
            events = list(client.audio.transcriptions.create(file=("a.wav", wav(samples)), model="granite",
                                                             stream=True))
            deltas = [e.delta for e in events if e.type == "transcript.text.delta"]
            assert events[-1].type == "transcript.text.done" and events[-1].text == expected.text
            # This random transcript is mostly single bytes of multi-byte characters, which the stream holds back
            # until they form characters: one delta may carry it all (several deltas are pinned for Voxtral and
            # Qwen2-Audio, through the same path).
            assert "".join(deltas).strip() == expected.text and deltas
            with pytest.raises(Exception, match="language"):
                client.audio.transcriptions.create(file=("a.wav", wav(samples)), model="granite", language="en")
    finally:
        engine.shutdown()
