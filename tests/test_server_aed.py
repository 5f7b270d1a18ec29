"""``oasr serve`` on a Canary directory: transcriptions with ``language`` and ``target_language``, translations,
and a 400 naming what the model cannot serve."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import soundfile as sf
from openai import BadRequestError, OpenAI

import oasr
from aed_reference import audio_batch, make_canary_checkpoint
from oasr.serving.app import build_app
from oasr.serving.settings import ServerSettings
from serving_harness import WAIT_S, running_server, small_engine


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    directory = make_canary_checkpoint(tmp_path_factory.mktemp("serve_canary"))
    engine = small_engine(str(directory))
    try:
        with running_server(build_app(engine, ServerSettings(served_model_name="canary"))) as url:
            yield directory, OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=WAIT_S)
    finally:
        engine.shutdown()


def wav() -> bytes:
    buffer = io.BytesIO()
    sf.write(buffer, audio_batch()[0], 16_000, format="WAV")
    return buffer.getvalue()


def offline(directory, **options) -> str:
    return oasr.transcribe([audio_batch()[0]], model=str(directory), device="cpu", dtype="float32", **options)[0].text


def test_transcriptions_and_translations_equal_offline(served):
    directory, client = served
    same = client.audio.transcriptions.create(file=("a.wav", wav()), model="canary", language="de")
    assert same.text == offline(directory, language="de")
    to_english = client.audio.transcriptions.create(file=("a.wav", wav()), model="canary", language="de",
                                                    extra_body={"target_language": "en"})
    translated = client.audio.translations.create(file=("a.wav", wav()), model="canary",
                                                  extra_body={"language": "de"})
    assert to_english.text == offline(directory, language="de", target_language="en")
    assert offline(directory, language="de", target_language="en") != offline(directory, language="de")
    # The translations route means English (Canary needs the spoken language: it does not detect it).
    assert translated.text == offline(directory, language="de", task="translate") == to_english.text


@pytest.mark.parametrize(("fields", "param"), [
    ({"language": "de", "extra_body": {"target_language": "xx"}}, "target_language"),
    ({"language": "de", "prompt": "hello"}, "prompt"),
    ({"language": "de", "response_format": "verbose_json", "timestamp_granularities": ["segment"]},
     "timestamp_granularities"),
])
def test_what_the_model_cannot_serve_is_a_400_naming_it(served, fields, param):
    _, client = served
    with pytest.raises(BadRequestError) as info:
        client.audio.transcriptions.create(file=("a.wav", wav()), model="canary", **fields)
    error = info.value.body
    assert error["code"] == "unsupported_option"
    assert error["param"] == param, error
    assert "serve_canary" not in error["message"]  # the model is named as served, not by its path



def test_a_long_upload_is_cut_where_offline_cuts_it():
    """Longer than Canary's 40 s window: the server cuts at the quiet points offline cuts at (the energy detector,
    for decoders without timestamps), not at the window edge; Whisper's server keeps fixed windows."""
    from types import SimpleNamespace

    import numpy as np

    from oasr.audio import load_audio
    from oasr.engine.engine import EngineStats
    from oasr.models import ARCHITECTURES
    from oasr.models.capabilities import capabilities_of
    from oasr.serving.serving import OpenAIServingTranscription
    from oasr.transcription.offline import SpanPlanner, fixed_spans, long_audio_detector

    jfk = load_audio(Path(oasr.__file__).parent / "assets" / "jfk.flac")  # 11 s of speech
    gap = np.zeros(32_000, np.float32)
    audio = np.concatenate([jfk, gap, jfk, gap, jfk, gap, jfk])  # 50 s
    window = 40 * 16_000
    for name, detector in (("canary", "energy"), ("whisper", None)):
        capabilities = capabilities_of(ARCHITECTURES.get(name))
        assert long_audio_detector(capabilities, None) == detector
        engine = SimpleNamespace(capabilities=capabilities, window_samples=window, tokenizer=None, alive=True,
                                 stats=lambda: EngineStats(0, 0, 0, 0, 1))
        served = OpenAIServingTranscription(engine, ServerSettings(served_model_name=name)).span_planner(audio)
        assert served == SpanPlanner(detector, window)(audio)
    quiet = SpanPlanner("energy", window)(audio)
    assert quiet != fixed_spans(len(audio), window) and all(b - a <= window for a, b in quiet), quiet
