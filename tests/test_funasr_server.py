"""``oasr serve`` on FunASR folders: Paraformer's CIF word timestamps and SenseVoice's emotion and event tags in
``verbose_json``, against FunASR's recorded outputs (tests/data/funasr/, made by scripts/funasr_oracle/; CI never
runs FunASR)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from openai import OpenAI

from oasr.serving.app import build_app
from oasr.serving.settings import ServerSettings
from oasr.tokenizers.sense_voice import EMOTIONS, EVENTS
from serving_harness import WAIT_S, running_server, small_engine
from tests.speech_data import audio_path, require_speech_data

DATA = Path(__file__).parent / "data" / "funasr"


def golden(name: str) -> dict:
    return json.loads((DATA / f"{name}.json").read_text(encoding="utf-8"))


def first_clip(name: str) -> Path:
    by_id = {e["id"]: e for e in require_speech_data()}
    return audio_path(by_id[golden(name)["clips"][0]])


@pytest.fixture(scope="module", params=["paraformer", "sense_voice"])
def served(request):
    engine = small_engine(str(DATA / request.param))
    try:
        with running_server(build_app(engine, ServerSettings(served_model_name="funasr"))) as url:
            yield request.param, OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=WAIT_S)
    finally:
        engine.shutdown()


def test_verbose_json_words_are_funasrs_cif_timestamps(served) -> None:
    name, client = served
    if name != "paraformer":
        pytest.skip("SenseVoice times no words")
    clip = first_clip(name)
    verbose = client.audio.transcriptions.create(file=(clip.name, clip.read_bytes()), model="funasr",
                                                 response_format="verbose_json", timestamp_granularities=["word"])
    expected = golden(name)
    assert [w.word for w in verbose.words] == expected["timestamp_texts"][0].split(" ")
    assert [[round(w.start * 1000), round(w.end * 1000)] for w in verbose.words] == expected["word_timestamps"][0]
    assert not verbose.model_extra.get("emotion") and not verbose.model_extra.get("event")


def _first(tags: tuple[str, ...], text: str) -> str | None:
    found = re.search("|".join(re.escape(f"<|{t}|>") for t in tags), text)
    return found.group(0)[2:-2] if found else None


def test_verbose_json_reports_the_emotion_and_event_sense_voice_wrote(served) -> None:
    name, client = served
    if name != "sense_voice":
        pytest.skip("Paraformer writes no tags")
    clip = first_clip(name)
    run = next(r for r in golden(name)["runs"] if r["language"] == "auto" and r["use_itn"])  # OASR's defaults
    verbose = client.audio.transcriptions.create(file=(clip.name, clip.read_bytes()), model="funasr",
                                                 response_format="verbose_json")
    emotion, event = _first(EMOTIONS, run["texts"][0]), _first(EVENTS, run["texts"][0])
    assert event is not None  # the tiny model wrote at least one tag to report
    assert verbose.model_extra.get("emotion") == emotion and verbose.model_extra.get("event") == event
