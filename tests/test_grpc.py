"""``oasr serve --grpc-port`` with tiny.en, driven by NVIDIA's own Riva client (``riva.client.ASRService``, in the
Riva venv): Recognize answers what the HTTP route answers for the same samples, its words are verbose_json's,
StreamingRecognize gives interim results and finals per VAD turn, and each kind of bad call gets its status code.
"""

from __future__ import annotations

import io
import re

import httpx
import numpy as np
import pytest
import soundfile as sf

from oasr.audio import load_audio
from oasr.serving.grpc.config import RIVA_BOOST_PER_OASR_BOOST
from oasr.types import SERVER_HOTWORD_BEAM_SIZE
from grpc_harness import API_KEY, grpc_server, http_transcript, pcm16, require_riva_client
from serving_harness import engine_idle, metrics, wait_until
from speech_data import audio_path, english_short
from test_realtime import JFK


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    require_riva_client()
    with grpc_server("tiny.en") as running:
        yield running


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> list[tuple[bytes, bytes]]:
    """JFK and two shared clips, each as raw 16-bit PCM (for gRPC) and the same samples as a WAV (for HTTP)."""
    paths = [JFK, *(audio_path(e) for e in english_short(12.0)[:2])]
    pairs = []
    for path in paths:
        samples = np.frombuffer(pcm16(load_audio(path)), dtype="<i2")
        wav = io.BytesIO()
        sf.write(wav, samples, 16_000, format="WAV", subtype="PCM_16")
        pairs.append((samples.tobytes(), wav.getvalue()))
    return pairs


def raw_file(tmp_path, data: bytes, name: str = "clip.pcm") -> str:
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


def test_recognize_answers_the_http_transcript_with_verbose_json_words(server, clips, tmp_path):
    for index, (raw, wav) in enumerate(clips):
        answer = server.riva("recognize", audio=raw_file(tmp_path, raw, f"{index}.pcm"), words=True)
        http = http_transcript(server, wav, response_format="verbose_json", **{"timestamp_granularities[]": "word"})
        (result,) = answer["results"]
        assert result["transcript"] == http["text"] and http["text"].strip()
        words = [(w["word"], w["start_time"], w["end_time"]) for w in result["words"]]
        assert words == [(w["word"], round(w["start"] * 1000), round(w["end"] * 1000)) for w in http["words"]]
        assert all(0 < w["confidence"] <= 1 for w in result["words"])
    # A file in a container (FLAC) is read from its own header, as an upload is.
    flac = server.riva("recognize", audio=str(JFK), encoding="FLAC", sample_rate=0)
    assert flac["results"][0]["transcript"] == http_transcript(server, JFK.read_bytes())["text"]


def test_streaming_gives_interim_results_then_finals_per_vad_turn(server, clips, tmp_path):
    raw, wav = clips[0]
    expected = http_transcript(server, wav)["text"]
    # A pause longer than JFK's makes one turn of the clip, which is then the HTTP transcript.
    answer = server.riva("stream", audio=raw_file(tmp_path, raw), chunk_ms=100, stop_history=2000)
    finals = [r for r in answer["responses"] if r["is_final"]]
    interims = [r for r in answer["responses"] if not r["is_final"]]
    assert [r["transcript"] for r in finals] == [expected]
    assert interims and all(expected.startswith(r["transcript"]) for r in interims)
    assert answer["responses"].index(finals[0]) == len(answer["responses"]) - 1
    # The default 500 ms pause cuts JFK where it pauses: several finals, in order, covering the speech.
    turns = [r for r in server.riva("stream", audio=raw_file(tmp_path, raw))["responses"] if r["is_final"]]
    assert len(turns) > 1
    assert [r["audio_processed"] for r in turns] == sorted(r["audio_processed"] for r in turns)
    spoken = re.sub(r"[^a-z ]", "", " ".join(r["transcript"] for r in turns).lower()).split()
    assert spoken[-5:] == ["can", "do", "for", "your", "country"]


@pytest.mark.parametrize("args, code, field", [
    ({"key": "wrong"}, "UNAUTHENTICATED", "authorization"),
    ({"encoding_number": 7}, "INVALID_ARGUMENT", "config.encoding"),
    ({"sample_rate": 0}, "INVALID_ARGUMENT", "config.sample_rate_hertz"),
    ({"language": "de-DE"}, "INVALID_ARGUMENT", "config.language_code"),
    ({"profanity_filter": True}, "INVALID_ARGUMENT", "config.profanity_filter"),
    ({"custom": "colour:blue"}, "INVALID_ARGUMENT", "config.custom_configuration[colour]"),
    ({"boosted_words": ["kennedy"], "boost": 5000.0}, "INVALID_ARGUMENT", "config.speech_contexts[0].boost"),
])
def test_bad_calls_get_their_status_code_naming_the_field(server, clips, tmp_path, args, code, field):
    audio = raw_file(tmp_path, clips[0][0])
    error = server.riva("recognize", audio=audio, **args)["error"]
    assert error["code"] == code and field in error["details"]
    streamed = server.riva("stream", audio=audio, **args)["error"]
    assert streamed["code"] == code and re.sub(r"^config\.", "streaming_config.config.", field) in streamed["details"]


def test_boosted_words_are_whisper_s_beam_search_hotwords(server, clips, tmp_path):
    """Riva's word boosting on Whisper: its beam search with the phrases as hotwords, as the HTTP route decodes."""
    raw, wav = clips[0]
    boost = 20.0 / RIVA_BOOST_PER_OASR_BOOST
    expected = http_transcript(server, wav, beam_size=SERVER_HOTWORD_BEAM_SIZE, hotwords=f"kennedy:{boost}")["text"]
    answer = server.riva("recognize", audio=raw_file(tmp_path, raw), boosted_words=["kennedy"], boost=20.0)
    assert answer["results"][0]["transcript"] == expected


def test_a_cancelled_stream_frees_its_engine_work_and_metrics_count_calls(server, clips, tmp_path):
    before = metrics(server.url)
    answer = server.riva("cancel", audio=raw_file(tmp_path, clips[0][0]), after=1, stop_history=300)
    assert answer["error"]["code"] == "CANCELLED" and answer["num_results"] >= 1
    wait_until(lambda: engine_idle(server.url), "the cancelled stream's engine work to end", timeout_s=30)
    key = 'oasr_grpc_requests_total{code="CANCELLED",method="StreamingRecognize"}'
    wait_until(lambda: metrics(server.url).get(key, 0) == before.get(key, 0) + 1, "the cancel to be counted",
               timeout_s=30)
    audio = raw_file(tmp_path, clips[-1][0])
    server.riva("recognize", audio=audio)
    server.riva("recognize", audio=audio, key="wrong")
    after = metrics(server.url)
    for code in ("OK", "UNAUTHENTICATED"):
        key = f'oasr_grpc_requests_total{{code="{code}",method="Recognize"}}'
        assert after[key] == before.get(key, 0) + 1


def test_the_config_lists_the_served_model_and_refuses_a_wrong_key(server):
    (model,) = server.riva("config")["models"]
    assert model["model_name"] == "tiny.en"
    assert model["parameters"]["streaming"] == "false" and model["parameters"]["word_time_offsets"] == "true"
    assert server.riva("config", key="wrong")["error"]["code"] == "UNAUTHENTICATED"
    assert httpx.get(f"{server.url}/v1/models", headers={"Authorization": f"Bearer {API_KEY}"}).status_code == 200
