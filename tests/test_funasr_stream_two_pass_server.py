"""``/v1/realtime`` with a two-pass final (``oasr serve --final-model``): the engine core holds FunASR's online
Paraformer and, beside it, the offline one (tests/data/funasr/); a committed turn's deltas are the online
model's streamed text, and its ``completed`` transcript is the offline model's over the turn's samples."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import soundfile as sf

import oasr
from oasr.serving.app import build_app
from oasr.serving.settings import ServerSettings
from oasr.streaming.types import StreamingConfig
from serving_harness import metrics, running_server, small_engine
from test_funasr_stream_server import COMPLETED, DELTA, MODEL, streamed
from test_realtime import API_KEY, as_served, connect, item_events, next_event, pcm16_24k, send_audio, update
from tests.speech_data import audio_path, require_speech_data

OFFLINE = Path(__file__).parent / "data" / "funasr" / "paraformer"


@pytest.fixture(scope="module")
def server():
    engine = small_engine(str(MODEL), streaming=StreamingConfig(final_model=str(OFFLINE)))
    try:
        with running_server(build_app(engine, ServerSettings(served_model_name="paraformer",
                                                             api_keys=(API_KEY,)))) as url:
            yield url
    finally:
        engine.shutdown()


def turn_pcm() -> bytes:
    by_id = {e["id"]: e for e in require_speech_data()}
    return pcm16_24k(sf.read(str(audio_path(by_id["ps_librivox_0880"])), dtype="float32")[0])


def committed_turn(server: str, pcm: bytes) -> list[dict]:
    """One session's events from a committed turn of ``pcm`` to its ``completed``."""

    async def session() -> list[dict]:
        async with connect(server, "ga") as conn:
            await next_event(conn, "ga")
            await update(conn, "ga", turn_detection=None)
            await send_audio(conn, pcm)
            await conn.input_audio_buffer.commit()
            events = [await next_event(conn, "ga")]
            while events[-1]["type"] != COMPLETED:
                events.append(await next_event(conn, "ga"))
            return events

    return asyncio.run(session())


def test_a_streamed_turn_is_completed_with_the_final_models_transcript(server) -> None:
    pcm = turn_pcm()
    events = committed_turn(server, pcm)
    committed = next(e for e in events if e["type"] == "input_audio_buffer.committed")
    mine = item_events(events, committed["item_id"])
    deltas = [e["delta"] for e in mine if e["type"] == DELTA]
    final = oasr.transcribe(as_served(pcm), oasr.from_pretrained(OFFLINE, device="cpu", dtype="float32"))[0].text
    assert len(deltas) >= 3 and "".join(deltas) == streamed(as_served(pcm))  # the online model's, as they came
    assert mine[-1]["transcript"] == final and final != "".join(deltas)


def test_metrics_count_the_turns_final_as_completed_by_the_final_model(server) -> None:
    before = metrics(server)
    events = committed_turn(server, turn_pcm())
    after = metrics(server)  # the core's stats travel with the step that sent the final, ahead of its events
    assert events[-1]["type"] == COMPLETED
    sent = {name: after[name] - before[name] for name in (
        "oasr_final_model_finals_completed_total", "oasr_final_model_fallbacks_total")}
    assert sent == {"oasr_final_model_finals_completed_total": 1, "oasr_final_model_fallbacks_total": 0}
    assert [after[f"oasr_final_model_{name}"] for name in ("finals_waiting", "requests_waiting",
                                                           "requests_running")] == [0, 0, 0]
