"""A real server (``oasr serve --vad fsmn:DIR`` on FunASR's online Paraformer folder, as FunASR's two-pass server
pairs them): the official client's session turns at FunASR's FSMN-VAD segments, each turn streamed live from
its start while it is spoken, and its ``completed`` transcript is the streaming engine's own for the turn's
samples, so the live stream was never fed audio past the turn's end."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest

from oasr.serving.app import build_app
from oasr.serving.settings import RealtimeSettings, ServerSettings
from serving_harness import running_server, small_engine
from test_funasr_stream_server import streamed
from test_funasr_vad_realtime import FSMN, SAMPLES_PER_MS, STARTED, STOPPED, golden_edges
from test_realtime import API_KEY, as_served, connect, item_events, next_event, pcm16_24k, send_audio
from tests.speech_data import clips

DATA = Path(__file__).parent / "data" / "funasr"
MODEL = DATA / "paraformer_streaming"
COMPLETED = "conversation.item.input_audio_transcription.completed"
NUM_TURNS = 2


@pytest.fixture(scope="module")
def server():
    engine = small_engine(str(MODEL))
    settings = ServerSettings(served_model_name="paraformer", api_keys=(API_KEY,),
                              realtime=RealtimeSettings(vad=FSMN))
    try:
        with running_server(build_app(engine, settings)) as url:
            yield url
    finally:
        engine.shutdown()


def test_a_live_session_turns_at_fsmn_segments_and_streams_each_turn(server) -> None:
    golden = json.loads((DATA / "fsmn_vad_realtime.json").read_text())
    pieces = golden_edges(golden)
    # The stream up to the piece that ends the second segment, and half a second for the server's resampler.
    last_piece = [index for index, edges in enumerate(pieces) if edges][2 * NUM_TURNS - 1]
    num_samples = int(((last_piece + 1) * golden["chunk_ms"] / 1000 + 0.5) * 16_000)
    parts = {clip.id: clip.audio for clip in clips({clip_id for clip_id, _ in golden["stream"]})}
    audio = np.concatenate([parts[clip_id] for clip_id, _ in golden["stream"]])[:num_samples]
    pcm = pcm16_24k(audio)

    async def session() -> list[dict]:
        async with connect(server, "ga") as conn:
            created = await next_event(conn, "ga")
            assert created["session"]["audio"]["input"]["turn_detection"]["type"] == "server_vad"
            await send_audio(conn, pcm)
            events = []
            while sum(e["type"] == COMPLETED for e in events) < NUM_TURNS:
                events.append(await next_event(conn, "ga"))
            return events

    events = asyncio.run(session())
    assert not [e for e in events if e["type"] == "error"]
    edges = [edge.sample // SAMPLES_PER_MS for piece in pieces for edge in piece][: 2 * NUM_TURNS]
    started = [e for e in events if e["type"] == STARTED]
    stopped = [e for e in events if e["type"] == STOPPED]
    assert [(e["audio_start_ms"], f["audio_end_ms"]) for e, f in zip(started, stopped, strict=True)] == \
        list(zip(edges[::2], edges[1::2], strict=True))
    heard = as_served(pcm)
    for begun, ended in zip(started, stopped, strict=True):
        mine = item_events(events, begun["item_id"])
        assert mine[0]["type"] == STARTED and mine[-1]["type"] == COMPLETED
        turn = heard[begun["audio_start_ms"] * SAMPLES_PER_MS : ended["audio_end_ms"] * SAMPLES_PER_MS]
        assert mine[-1]["transcript"] == streamed(turn)
