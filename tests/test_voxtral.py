"""Voxtral against transformers' ``VoxtralForConditionalGeneration``: a tiny random checkpoint saved with
``save_pretrained`` (plus a tekken.json), loaded through ``oasr.from_pretrained`` key for key. On CPU fp32 the
features, the projected encoder output (one 30 s window and several, batched) and the transcription request's ids
match the reference's, and the engine's greedy tokens are those of transformers' ``generate`` for a batch of
inputs shorter and longer than one window, with the language detected and forced; ``oasr transcribe
--output-format jsonl`` prints them and ``oasr serve`` answers with them, streaming and not.

Each input's features depend on that input alone (the processor pads each to its own whole windows), so the
reference is ``generate`` over each input on its own while the engine decodes them all together."""

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
from voxtral_reference import (
    SAMPLE_RATE,
    audio_batch,
    load_reference,
    make_checkpoint,
    num_audio_tokens,
    reference_features,
    reference_generate,
    reference_prompt_ids,
)

TOLERANCE = 1e-4
MAX_NEW = 24
SECONDS = (0.7, 3.1, 31.0, 62.5)  # one window, one window, two windows, three windows


@pytest.fixture(scope="module")
def directory(tmp_path_factory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("voxtral"))


@pytest.fixture(scope="module")
def loaded(directory: Path):
    return oasr.from_pretrained(directory, device="cpu", dtype="float32")


def engine_for(loaded) -> ASREngine:
    return ASREngine(loaded, EngineConfig(scheduler=SchedulerConfig(max_num_seqs=8, max_encode_rows=2),
                                          cache=CacheConfig(memory_budget_bytes=64 << 20)))


def test_checkpoint_loads_key_for_key(directory: Path, loaded) -> None:
    """The published layout (``audio_tower.*``, ``language_model.model.*``, ``language_model.lm_head``), which
    transformers writes too, loads tensor for tensor."""
    assert loaded.architecture == "voxtral"
    ours, theirs = loaded.model.state_dict(), load_file(directory / "model.safetensors")
    assert set(ours) == set(theirs)
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    spec = loaded.model.decoder_spec
    assert spec.cross is None and spec.prompt_audio is not None and spec.num_kv_heads < spec.num_heads


@pytest.mark.parametrize("seconds", [0.7, 30.0, 31.0])
def test_features_equal_the_processors(loaded, seconds: float) -> None:
    (audio,) = audio_batch((seconds,))
    reference = reference_features(audio, loaded.config.num_mel_bins)  # [windows, n_mels, 3000]
    ours = loaded.features.padded([audio])[0]
    windows = reference.shape[0]
    assert ours.shape[-1] == windows * 3000 == int(loaded.features.frame_lengths(torch.tensor([len(audio)]))[0])
    assert (ours.view(ours.shape[0], windows, 3000).transpose(0, 1) - reference).abs().max() < 1e-5


@torch.no_grad()
def test_encoder_output_matches_the_reference_batched(directory: Path, loaded) -> None:
    audio = audio_batch(SECONDS)
    features = loaded.features.padded(audio)
    lengths = loaded.features.frame_lengths(torch.tensor([len(a) for a in audio]))
    ours = loaded.model.encode(features, lengths)
    reference_model = load_reference(directory)
    assert ours.lengths.tolist() == [num_audio_tokens(len(a)) for a in audio] == [375, 375, 750, 1125]
    for row, samples in enumerate(audio):
        reference = reference_model.get_audio_features(reference_features(samples, 16)).pooler_output
        assert (ours.hidden[row, : ours.lengths[row]] - reference).abs().max() < TOLERANCE
        assert reference.std() > 0.1  # the comparison is not between near-zero values
    assert not ours.hidden[0, 375:].any()  # past a row's windows, nothing


@pytest.mark.parametrize("language", [None, "en", "fr"])
def test_prompt_ids_equal_the_transcription_request(directory: Path, loaded, language) -> None:
    engine = engine_for(loaded)
    options = DecodeOptions(language=language)
    for seconds in (3.1, 31.0):
        samples = int(seconds * SAMPLE_RATE)
        n = engine.runner.audio_positions(engine.runner.num_frames(samples))
        prompt = engine.runner.prompter.prompt(options, None, n)
        assert list(prompt.token_ids) == reference_prompt_ids(directory, samples, language)
        assert prompt.token_ids[prompt.audio_index : prompt.audio_index + n] == (24,) * n
        assert engine.runner.prompt_len_for(options, samples) == len(prompt.token_ids)


@pytest.mark.parametrize("language", [None, "en"])
def test_engine_tokens_equal_transformers_generate(directory: Path, loaded, language) -> None:
    audio = audio_batch(SECONDS)
    expected = reference_generate(directory, audio, language=language, max_new_tokens=MAX_NEW)
    assert len({tuple(row) for row in expected}) == len(expected), "identical rows: the comparison could hardly fail"
    assert all(len(set(row)) > 2 for row in expected)
    options = DecodeOptions(language=language, max_new_tokens=MAX_NEW)
    outputs = {o.request_id: o for o in engine_for(loaded).run((f"r{i}", a, options) for i, a in enumerate(audio))}
    assert [outputs[f"r{i}"].token_ids for i in range(len(audio))] == expected
    assert {outputs[f"r{i}"].language for i in range(len(audio))} == {language}


def test_requests_refuse_what_a_transcription_request_cannot_say(loaded) -> None:
    engine = engine_for(loaded)
    (audio,) = audio_batch((1.0,))
    for options, match in [(DecodeOptions(language="english"), "language='english'"),
                           (DecodeOptions(timestamps=True), "timestamps"),
                           (DecodeOptions(task="translate"), "translat"),
                           (DecodeOptions(prompt="cats"), "prompt")]:
        with pytest.raises(UnsupportedOptionError, match=match):
            engine.add_request(audio, options)


@pytest.fixture(scope="module")
def ending(directory: Path, tmp_path_factory):
    """A copy whose config.json also ends on a token the model writes early: (directory, its end tokens)."""
    (audio,) = audio_batch((3.1,))
    row = reference_generate(directory, [audio], language="en", max_new_tokens=MAX_NEW)[0]
    stop = next(t for t in row[6:] if t not in row[:6])  # the row then ends after six tokens or more
    copy = make_checkpoint(tmp_path_factory.mktemp("voxtral_ending"), extra_end=stop)
    return copy, (2, stop)


def test_cli_jsonl_prints_the_generated_tokens(ending, tmp_path: Path, capsys) -> None:
    directory, ends = ending
    (audio,) = audio_batch((3.1,))
    path = tmp_path / "clip.wav"
    sf.write(path, audio, SAMPLE_RATE, subtype="FLOAT")
    assert main(["transcribe", str(path), "--model", str(directory), "--device", "cpu", "--language", "en",
                 "--output-format", "jsonl"]) == 0
    row = json.loads(capsys.readouterr().out)
    expected = reference_generate(directory, [audio], language="en", max_new_tokens=MAX_NEW, ends=ends)[0]
    assert row["token_ids"] == expected and len(expected) > 2
    assert row["language"] == "en"
    assert row["text"] == oasr.from_pretrained(directory, device="cpu").tokenizer.decode(expected).strip()


def wav(samples) -> bytes:
    buffer = io.BytesIO()
    sf.write(buffer, samples, SAMPLE_RATE, format="WAV", subtype="FLOAT")
    return buffer.getvalue()


def test_serve_answers_streaming_and_not(ending) -> None:
    """The official client's transcription equals offline decoding; with ``stream=true`` the deltas join into
    the same text, more than one delta for a transcript of several tokens, and the done event carries it."""
    from openai import OpenAI

    from oasr.serving.app import build_app
    from oasr.serving.settings import ServerSettings
    from serving_harness import WAIT_S, running_server, small_engine

    directory, _ = ending
    (samples,) = audio_batch((3.1,))
    expected = oasr.transcribe([samples], model=str(directory), device="cpu", dtype="float32", language="en")[0]
    assert expected.text
    engine = small_engine(str(directory), mode="thread")
    try:
        with running_server(build_app(engine, ServerSettings(served_model_name="voxtral"))) as url:
            client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=WAIT_S)
            answer = client.audio.transcriptions.create(file=("a.wav", wav(samples)), model="voxtral", language="en")
            assert answer.text == expected.text
            events = list(client.audio.transcriptions.create(file=("a.wav", wav(samples)), model="voxtral",
                                                             language="en", stream=True))
            deltas = [e.delta for e in events if e.type == "transcript.text.delta"]
            assert events[-1].type == "transcript.text.done" and events[-1].text == expected.text
            assert "".join(deltas).strip() == expected.text and len(deltas) > 1
            with pytest.raises(Exception, match="translat"):
                client.audio.translations.create(file=("a.wav", wav(samples)), model="voxtral")
    finally:
        engine.shutdown()
