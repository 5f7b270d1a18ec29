"""``oasr serve --punctuate``: whole-file answers (json, verbose_json words) carry the CT-Transformer's punctuation
of FunASR's golden (tests/data/funasr/ct_punc.json), words keeping their CIF times; a realtime streamed turn's
``completed`` transcript is punctuated while its deltas stay as decoded; a model that punctuates is refused."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import soundfile as sf
from openai import OpenAI

from oasr.errors import UnsupportedOptionError
from oasr.models import ARCHITECTURES
from oasr.models.capabilities import capabilities_of
from oasr.serving.app import build_app
from oasr.serving.settings import ServerSettings
from oasr.transcription.punctuation import load_punctuator, punctuator_for
from serving_harness import WAIT_S, running_server, small_engine
from test_realtime import API_KEY, connect, item_events, next_event, pcm16_24k, send_audio, update
from tests.speech_data import audio_path, require_speech_data

DATA = Path(__file__).parent / "data" / "funasr"
PUNC = DATA / "ct_punc"
COMPLETED = "conversation.item.input_audio_transcription.completed"
DELTA = "conversation.item.input_audio_transcription.delta"


def golden(name: str) -> dict:
    return json.loads((DATA / f"{name}.json").read_text(encoding="utf-8"))


def clip(name: str) -> Path:
    by_id = {e["id"]: e for e in require_speech_data()}
    return audio_path(by_id[name])


@pytest.fixture(scope="module")
def client():
    engine = small_engine(str(DATA / "paraformer"))
    try:
        settings = ServerSettings(served_model_name="funasr", punctuate=str(PUNC))
        with running_server(build_app(engine, settings)) as url:
            yield OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=WAIT_S)
    finally:
        engine.shutdown()


def test_whole_file_answers_carry_funasrs_punctuation(client) -> None:
    expected, plain = golden("ct_punc")["paraformer"], golden("paraformer")
    for index in (0, 1):
        path = clip(expected["clips"][index])
        text = client.audio.transcriptions.create(file=(path.name, path.read_bytes()), model="funasr")
        assert text.text == expected["texts"][index].strip()
        verbose = client.audio.transcriptions.create(file=(path.name, path.read_bytes()), model="funasr",
                                                     response_format="verbose_json",
                                                     timestamp_granularities=["word"])
        assert verbose.text == text.text
        assert [[round(w.start * 1000), round(w.end * 1000)] for w in verbose.words] == plain["word_timestamps"][index]
        assert "".join(w.word for w in verbose.words).replace(" ", "") == text.text.replace(" ", "")


def test_a_streamed_answer_ends_with_the_punctuated_text(client) -> None:
    expected = golden("ct_punc")["paraformer"]
    path = clip(expected["clips"][0])
    events = list(client.audio.transcriptions.create(file=(path.name, path.read_bytes()), model="funasr",
                                                     stream=True))
    assert events[-1].type == "transcript.text.done" and events[-1].text == expected["texts"][0].strip()


def test_serve_refuses_a_missing_folder_before_the_engine_starts(capsys, tmp_path) -> None:
    from oasr.cli import main

    assert main(["serve", "--model", str(DATA / "paraformer"), "--punctuate", str(tmp_path)]) == 2
    assert "oasr: error: --punctuate" in capsys.readouterr().err


def test_a_model_that_writes_punctuation_is_refused_one() -> None:
    with pytest.raises(UnsupportedOptionError, match="writes its own punctuation: --punctuate"):
        punctuator_for(str(PUNC), capabilities_of(ARCHITECTURES.get("sense_voice")), "sense_voice")
    assert punctuator_for(None, capabilities_of(ARCHITECTURES.get("sense_voice")), "sense_voice") is None


def test_a_streamed_realtime_turn_completes_punctuated() -> None:
    engine = small_engine(str(DATA / "paraformer_streaming"))
    settings = ServerSettings(served_model_name="paraformer", api_keys=(API_KEY,), punctuate=str(PUNC))
    pcm = pcm16_24k(sf.read(str(clip("ps_librivox_0880")), dtype="float32")[0])

    async def session(url: str) -> list[dict]:
        async with connect(url, "ga") as conn:
            await next_event(conn, "ga")
            await update(conn, "ga", turn_detection=None)
            await send_audio(conn, pcm)
            await conn.input_audio_buffer.commit()
            events = [await next_event(conn, "ga")]
            while events[-1]["type"] != COMPLETED:
                events.append(await next_event(conn, "ga"))
            return events

    try:
        with running_server(build_app(engine, settings)) as url:
            events = asyncio.run(session(url))
    finally:
        engine.shutdown()
    committed = next(e for e in events if e["type"] == "input_audio_buffer.committed")
    mine = item_events(events, committed["item_id"])
    decoded = "".join(e["delta"] for e in mine if e["type"] == DELTA).strip()
    assert len(decoded) >= 10
    [written] = load_punctuator(PUNC).punctuate([decoded])
    assert mine[-1]["transcript"] == written.text.strip() != decoded
