"""``oasr serve`` on a Qwen3-ASR directory: the official client's transcription equals offline decoding, with a
forced language and a context prompt, and the language comes back as the code the model's output names."""

from __future__ import annotations

import io

import pytest
import soundfile as sf
from openai import OpenAI

import oasr
from oasr.serving.app import build_app
from oasr.serving.languages import openai_language_name
from oasr.serving.settings import ServerSettings
from qwen3_reference import SAMPLE_RATE, audio_batch, make_checkpoint
from serving_harness import WAIT_S, running_server, small_engine


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    directory = make_checkpoint(tmp_path_factory.mktemp("serve_qwen3_asr"), seed=1)
    engine = small_engine(str(directory))
    try:
        with running_server(build_app(engine, ServerSettings(served_model_name="qwen3-asr"))) as url:
            yield directory, OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=WAIT_S)
    finally:
        engine.shutdown()


def wav(samples) -> bytes:
    buffer = io.BytesIO()
    sf.write(buffer, samples, SAMPLE_RATE, format="WAV", subtype="FLOAT")
    return buffer.getvalue()


@pytest.mark.parametrize(("language", "prompt"), [(None, None), ("de", "Berlin, Hamburg")])
def test_transcriptions_equal_offline(served, language, prompt) -> None:
    directory, client = served
    samples = audio_batch((2.7,))[0]
    expected = oasr.transcribe([samples], model=str(directory), device="cpu", dtype="float32", language=language,
                               prompt=prompt)[0]
    kwargs = {k: v for k, v in (("language", language), ("prompt", prompt)) if v is not None}
    answer = client.audio.transcriptions.create(file=("a.wav", wav(samples)), model="qwen3-asr",
                                                response_format="verbose_json", **kwargs)
    assert answer.text == expected.text and answer.text
    assert answer.language == (openai_language_name(expected.language) if expected.language else "")  # "" unknown
