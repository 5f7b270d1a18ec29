"""``oasr serve`` with a multilingual model: the translations route, and language detection."""

from __future__ import annotations

from pathlib import Path

import pytest
from openai import OpenAI

import oasr
from oasr.serving.app import build_app
from oasr.serving.settings import ServerSettings
from serving_harness import WAIT_S, running_server, small_engine

JFK = Path(oasr.__file__).parent / "assets" / "jfk.flac"


@pytest.fixture(scope="module")
def client(base_multilingual):
    engine = small_engine("base")
    try:
        with running_server(build_app(engine, ServerSettings(served_model_name="base"))) as url:
            yield OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=WAIT_S)
    finally:
        engine.shutdown()


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the openai package marks translations deprecated
def test_translation_equals_offline_translation(client, base_multilingual):
    expected = oasr.transcribe(JFK, model=base_multilingual, task="translate")[0]
    assert client.audio.translations.create(file=(JFK.name, JFK.read_bytes()), model="base").text == expected.text
    timed = oasr.transcribe(JFK, model=base_multilingual, task="translate", timestamps=True)[0]  # as verbose_json
    verbose = client.audio.translations.create(file=(JFK.name, JFK.read_bytes()), model="whisper-1",
                                               response_format="verbose_json")
    assert (verbose.text, verbose.language, verbose.duration) == (timed.text, "english", timed.duration_s)
    assert [t for s in verbose.segments for t in s.tokens] == timed.token_ids


def test_detected_language_is_reported(client, base_multilingual):
    expected = oasr.transcribe(JFK, model=base_multilingual)[0]
    verbose = client.audio.transcriptions.create(file=(JFK.name, JFK.read_bytes()), model="base",
                                                 response_format="verbose_json")
    assert expected.language == "en"  # offline results keep the code; verbose_json writes the name, as OpenAI does
    assert (verbose.text, verbose.language) == (expected.text, "english")
