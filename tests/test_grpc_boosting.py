"""Riva's word boosting (``speech_contexts``, which the Riva client's ``add_word_boosting_to_config`` sends) as
OASR's hotwords, through NVIDIA's own client against a tiny random Parakeet CTC checkpoint: Recognize answers what
the HTTP route answers with the same phrases as ``hotwords`` (the boost on OASR's scale, Riva's score / 10) and a
beam of ``SERVER_HOTWORD_BEAM_SIZE``, or the beam ``custom_configuration`` names; a bad boost is refused naming the
context. Whisper refusing them, and a streaming model's stream, are in test_grpc.py and test_grpc_streaming.py."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from oasr.audio import load_audio
from oasr.serving.grpc.config import RIVA_BOOST_PER_OASR_BOOST
from oasr.types import SERVER_HOTWORD_BEAM_SIZE
from grpc_harness import grpc_server, http_transcript, pcm16, require_riva_client
from parakeet_reference import build_reference, write_tokenizer
from test_realtime import JFK

PHRASE, RIVA_SCORE = "the cat", 40.0  # 4.0 a token: enough to move the random model's beam (test_hotwords.py)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    require_riva_client()
    directory = tmp_path_factory.mktemp("grpc_ctc")
    build_reference("ctc").save_pretrained(directory)
    write_tokenizer(directory / "tokenizer.json", "<pad>")
    with grpc_server(str(directory)) as running:
        yield running


@pytest.fixture(scope="module")
def jfk(tmp_path_factory) -> tuple[str, bytes]:
    """JFK as raw 16-bit PCM in a file (for the Riva client) and the same samples as a WAV (for HTTP)."""
    pcm = pcm16(load_audio(JFK))
    path = tmp_path_factory.mktemp("grpc_boost") / "jfk.pcm"
    path.write_bytes(pcm)
    wav = io.BytesIO()
    sf.write(wav, np.frombuffer(pcm, dtype="<i2"), 16_000, format="WAV", subtype="PCM_16")
    return str(path), wav.getvalue()


def recognized(server, audio: str, **args) -> str:
    answer = server.riva("recognize", audio=audio, **args)
    assert "error" not in answer, answer
    return " ".join(r["transcript"] for r in answer["results"])


def test_boosted_words_are_hotwords_searched_with_the_servers_beam(server, jfk):
    pcm, wav = jfk
    boost = RIVA_SCORE / RIVA_BOOST_PER_OASR_BOOST
    expected = http_transcript(server, wav, beam_size=SERVER_HOTWORD_BEAM_SIZE, hotwords=f"{PHRASE}:{boost}")["text"]
    plain = http_transcript(server, wav, beam_size=SERVER_HOTWORD_BEAM_SIZE)["text"]
    assert expected != plain, "the boost changed nothing: the comparison could not fail"
    assert recognized(server, pcm, boosted_words=[PHRASE], boost=RIVA_SCORE) == expected
    assert recognized(server, pcm) == http_transcript(server, wav)["text"]  # no contexts: greedy, as before


def test_a_custom_beam_size_is_the_one_boosted_words_are_searched_with(server, jfk):
    pcm, wav = jfk
    boost = RIVA_SCORE / RIVA_BOOST_PER_OASR_BOOST
    expected = http_transcript(server, wav, beam_size=2, hotwords=f"{PHRASE}:{boost}")["text"]
    assert recognized(server, pcm, boosted_words=[PHRASE], boost=RIVA_SCORE, custom="beam_size:2") == expected


def test_a_boost_no_scale_explains_is_refused_naming_its_context(server, jfk):
    pcm, _ = jfk
    error = server.riva("recognize", audio=pcm, boosted_words=[PHRASE], boost=5000.0)["error"]
    assert error["code"] == "INVALID_ARGUMENT" and "config.speech_contexts[0].boost" in error["details"], error
