"""StreamingRecognize with a two-pass final (``oasr serve --final-model``), through NVIDIA's Riva client: FunASR's
online Paraformer (tests/data/funasr/) streams the interim results and the offline Paraformer beside it in the
engine core gives the final, as a ``/v1/realtime`` turn's completed transcript is (test_funasr_stream_two_pass_server).
A gRPC stream is an engine stream, so nothing in the gRPC service knows of the second pass; this pins that it
reaches the Riva client all the same."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf

import oasr
from grpc_harness import grpc_server, pcm16, require_riva_client
from test_funasr_stream_server import MODEL, streamed
from test_funasr_stream_two_pass_server import OFFLINE
from tests.speech_data import audio_path, require_speech_data

ONE_UTTERANCE_MS = 60_000  # longer than the clip: no endpoint cuts the stream, one final


@pytest.fixture(scope="module")
def server():
    require_riva_client()
    with grpc_server(str(MODEL), "--final-model", str(OFFLINE)) as running:
        yield running


def test_a_streams_interims_are_the_online_models_and_its_final_the_offline_models(server, tmp_path) -> None:
    by_id = {e["id"]: e for e in require_speech_data()}
    samples = sf.read(str(audio_path(by_id["ps_librivox_0880"])), dtype="float32")[0]
    pcm = pcm16(samples)
    audio = tmp_path / "clip.pcm"
    audio.write_bytes(pcm)
    responses = server.riva("stream", audio=str(audio), chunk_ms=100, stop_history=ONE_UTTERANCE_MS)["responses"]
    heard = np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768  # the samples as the server reads them
    final = oasr.transcribe(heard, oasr.from_pretrained(OFFLINE, device="cpu", dtype="float32"))[0].text
    online = streamed(heard)
    assert final and final != online  # the two models differ, so the test tells them apart
    assert [r["transcript"] for r in responses if r["is_final"]] == [final] and responses[-1]["is_final"]
    interims = [r["transcript"] for r in responses[:-1]]
    assert len(interims) >= 3 and online.startswith(interims[-1])
