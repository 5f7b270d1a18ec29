"""``/v1/realtime`` on FunASR's online Paraformer folder (tests/data/funasr/paraformer_streaming/): a committed
turn streams through the ``paraformer_chunked`` runtime in the engine core, its deltas arrive and join to its
``completed`` transcript, which is the streaming engine's own for the samples the server heard."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

import oasr
from oasr.engine.streams import StreamingEngine
from oasr.serving.app import build_app
from oasr.serving.settings import ServerSettings
from oasr.streaming.types import StreamOptions
from serving_harness import running_server, small_engine
from test_realtime import API_KEY, as_served, connect, item_events, next_event, pcm16_24k, send_audio, update
from tests.speech_data import audio_path, require_speech_data

MODEL = Path(__file__).parent / "data" / "funasr" / "paraformer_streaming"
DELTA = "conversation.item.input_audio_transcription.delta"
COMPLETED = "conversation.item.input_audio_transcription.completed"


def streamed(samples: np.ndarray) -> str:
    engine = StreamingEngine(oasr.from_pretrained(MODEL, device="cpu", dtype="float32"))
    stream = engine.open(StreamOptions())
    engine.push(stream, samples)
    engine.close(stream)
    events = []
    while engine.has_unfinished():
        events += engine.step().events
    return events[-1].text.strip()


@pytest.fixture(scope="module")
def server():
    engine = small_engine(str(MODEL))
    try:
        with running_server(build_app(engine, ServerSettings(served_model_name="paraformer",
                                                             api_keys=(API_KEY,)))) as url:
            yield url
    finally:
        engine.shutdown()


def test_a_committed_turn_streams_deltas_that_join_to_the_engines_transcript(server) -> None:
    by_id = {e["id"]: e for e in require_speech_data()}
    audio = sf.read(str(audio_path(by_id["ps_librivox_0880"])), dtype="float32")[0]
    pcm = pcm16_24k(audio)

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

    events = asyncio.run(session())
    committed = next(e for e in events if e["type"] == "input_audio_buffer.committed")
    mine = item_events(events, committed["item_id"])
    deltas = [e["delta"] for e in mine if e["type"] == DELTA]
    expected = streamed(as_served(pcm))
    assert len(deltas) >= 3 and len(expected) >= 10  # streamed in several steps, and enough text to tell
    assert "".join(deltas) == mine[-1]["transcript"] == expected
