"""StreamingRecognize for a model that streams (the tiny random Nemotron streaming checkpoint the realtime tests
build), through NVIDIA's Riva client: interim results while the audio arrives and a final equal to what
``oasr transcribe --stream`` prints for the same samples, a cancelled stream frees its slot, and 64 streams at
once each get their final.

The HTTP route decodes a streaming model's file whole (transformers' offline ``generate``), a stream decodes it
chunk by chunk with the last chunk zero-padded (transformers' streaming ``generate``); the two texts part only in
the last chunk, which the first test also pins."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from oasr.audio import load_audio
from oasr.cli import main
from grpc_harness import grpc_server, http_transcript, pcm16, require_riva_client
from nemotron_reference import build_reference, save
from serving_harness import metrics, wait_until
from test_realtime import JFK

NUM_STREAMS = 64
# Longer than JFK, so that no endpoint cuts a stream: one utterance, one final per stream.
ONE_UTTERANCE_MS = 60_000
SHORT_S = 2  # the concurrent streams' clip: short, so 64 of them run in seconds on two cores


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return save(build_reference(), tmp_path_factory.mktemp("nemotron-grpc"))


@pytest.fixture(scope="module")
def server(checkpoint):
    require_riva_client()
    # One client (this host) opens all 64 streams.
    with grpc_server(str(checkpoint), "--realtime-max-sessions-per-client", "0", "--realtime-max-sessions-per-key",
                     "0") as running:
        yield running


@pytest.fixture(scope="module")
def jfk_pcm() -> bytes:
    """JFK as the 16-bit PCM the client sends."""
    return pcm16(load_audio(JFK))


def wav(pcm: bytes) -> bytes:
    out = io.BytesIO()
    sf.write(out, np.frombuffer(pcm, dtype="<i2"), 16_000, format="WAV", subtype="PCM_16")
    return out.getvalue()


def cli_stream_text(checkpoint: Path, pcm: bytes, tmp_path: Path, capsys) -> str:
    """What ``oasr transcribe --stream`` prints for the same samples."""
    path = tmp_path / "clip.wav"
    path.write_bytes(wav(pcm))
    capsys.readouterr()
    assert main(["transcribe", "--stream", "--model", str(checkpoint), "--device", "cpu", "--dtype", "float32",
                 "--output-format", "jsonl", str(path)]) == 0
    (row,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    return row["text"]


def test_a_stream_gets_interim_results_and_the_cli_streams_final(server, checkpoint, jfk_pcm, tmp_path, capsys):
    audio = tmp_path / "jfk.pcm"
    audio.write_bytes(jfk_pcm)
    responses = server.riva("stream", audio=str(audio), chunk_ms=100, stop_history=ONE_UTTERANCE_MS)["responses"]
    expected = cli_stream_text(checkpoint, jfk_pcm, tmp_path, capsys)
    assert len(set(expected.split())) >= 5  # a text varied enough that a wrong token shows
    assert [r["transcript"] for r in responses if r["is_final"]] == [expected] and responses[-1]["is_final"]
    interims = responses[:-1]
    assert len(interims) >= 3 and not any(r["is_final"] for r in interims)
    assert all(expected.startswith(r["transcript"]) and r["stability"] > 0 for r in interims)
    assert [r["audio_processed"] for r in interims] == sorted(r["audio_processed"] for r in interims)
    assert interims[0]["audio_processed"] < len(jfk_pcm) / 2 / 16_000 / 2  # the first came early in the audio
    # The whole-file decode agrees up to the stream's last word (the zero-padded last chunk; see the docstring).
    whole = http_transcript(server, wav(jfk_pcm))["text"]
    assert whole != expected and whole.startswith(expected.rsplit(" ", 1)[0])


def test_a_streamed_model_refuses_word_boosting_in_a_stream_naming_the_field(server, jfk_pcm, tmp_path):
    """Its streams decode greedily (no hotwords), so boosted words are refused rather than ignored."""
    audio = tmp_path / "jfk.pcm"
    audio.write_bytes(jfk_pcm)
    error = server.riva("stream", audio=str(audio), boosted_words=["kennedy"], boost=20.0)["error"]
    assert error["code"] == "INVALID_ARGUMENT" and "streaming_config.config.speech_contexts" in error["details"]
    assert "streams decode greedily" in error["details"], error


def test_a_cancelled_stream_frees_its_slot(server, jfk_pcm, tmp_path):
    audio = tmp_path / "jfk.pcm"
    audio.write_bytes(jfk_pcm)
    answer = server.riva("cancel", audio=str(audio), after=1)
    assert answer["error"]["code"] == "CANCELLED" and answer["num_results"] >= 1
    wait_until(lambda: metrics(server.url)["oasr_engine_streams_active"] == 0, "the stream's slot to be freed",
               timeout_s=30)


def test_64_streams_at_once_each_get_their_final(server, checkpoint, jfk_pcm, tmp_path, capsys):
    short = jfk_pcm[: 2 * 16_000 * SHORT_S]
    audio = tmp_path / "short.pcm"
    audio.write_bytes(short)
    answer = server.riva("streams", count=NUM_STREAMS, audio=str(audio), chunk_ms=100,
                         stop_history=ONE_UTTERANCE_MS, timeout_s=300)
    expected = cli_stream_text(checkpoint, short, tmp_path, capsys)
    assert expected and [s.get("final") for s in answer["streams"]] == [expected] * NUM_STREAMS, answer["streams"][:2]
    assert all(s["num_interim"] >= 1 for s in answer["streams"])
    wait_until(lambda: metrics(server.url)["oasr_engine_streams_active"] == 0, "every stream's slot to be freed",
               timeout_s=30)
