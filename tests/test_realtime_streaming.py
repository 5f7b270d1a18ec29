"""``/v1/realtime`` for a model that streams: a tiny random Nemotron streaming checkpoint served by a real
``oasr serve --model DIR --device cpu`` (and by the app on an engine core of its own where a test needs its own
settings), driven by the official ``openai`` client. Each turn is a live stream in the engine: its deltas arrive
while its audio is still being sent, they join to the ``completed`` transcript, and that transcript is the
streaming engine's own for the turn's samples. Server VAD cuts turns where Silero hears them (real speech: the
JFK recording), the same policy as for offline models. A client that leaves mid-turn frees its stream slot."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

import oasr
from oasr.audio import load_audio
from oasr.hosting.mp import MPClient
from oasr.hosting.protocol import EngineCoreSpec
from oasr.serving.app import build_app
from oasr.serving.settings import ServerSettings
from oasr.engine.streams import StreamingEngine
from oasr.streaming.types import StreamingConfig, StreamOptions
from nemotron_reference import build_reference, save
from serving_harness import SMALL_ENGINE, WAIT_S, metrics, running_server, wait_until
from test_realtime import (
    API_KEY,
    APPEND_BYTES,
    JFK,
    as_served,
    connect,
    item_events,
    next_event,
    pcm16_24k,
    send_audio,
    update,
)

DELTA = "conversation.item.input_audio_transcription.delta"
COMPLETED = "conversation.item.input_audio_transcription.completed"
FAILED = "conversation.item.input_audio_transcription.failed"
VAD = {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300, "silence_duration_ms": 500}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return save(build_reference(), tmp_path_factory.mktemp("nemotron-serve"))


@pytest.fixture(scope="module")
def streamed(checkpoint):
    """The streaming engine's transcript of some 16 kHz samples: what a turn of them must complete as."""
    engine = StreamingEngine(oasr.from_pretrained(checkpoint, device="cpu", dtype="float32"))

    def transcript(samples: np.ndarray) -> str:
        stream = engine.open(StreamOptions())
        engine.push(stream, samples)
        engine.close(stream)
        events = []
        while engine.has_unfinished():
            events += engine.step().events
        assert len(set(events[-1].token_ids)) >= 5, "a random model's text too poor to tell turns apart"
        return events[-1].text.strip()

    return transcript


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def server(checkpoint) -> str:
    """``oasr serve --model DIR --device cpu``, as a user starts it."""
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(oasr.__file__).parent.parent), *sys.path]),
           "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen([sys.executable, "-m", "oasr.cli", "serve", "--model", str(checkpoint), "--device",
                                "cpu", "--dtype", "float32", "--port", str(port), "--api-key", API_KEY], env=env)
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        assert process.poll() is None, "oasr serve exited"
        try:
            return httpx.get(f"{url}/health", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(healthy, "oasr serve to start")
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)


async def events_until_done(conn, item_ids: set[str] | None = None, quiet_s: float = 3.0) -> list[dict]:
    """Events until every item that started or was committed has finished and nothing more comes for
    ``quiet_s``."""
    events, open_items = [], set(item_ids or ())
    while True:
        try:
            event = await asyncio.wait_for(next_event(conn, "ga"), quiet_s if not open_items else WAIT_S)
        except TimeoutError:
            return events
        events.append(event)
        if event["type"] in ("input_audio_buffer.speech_started", "input_audio_buffer.committed"):
            open_items.add(event["item_id"])
        if event["type"] in (COMPLETED, FAILED):
            open_items.discard(event["item_id"])


def check_streamed_turn(events: list[dict], item_id: str, expected: str) -> list[dict]:
    """The item's deltas, in order before its ``completed``, join to its transcript, which is ``expected``."""
    mine = item_events(events, item_id)
    assert mine[-1]["type"] == COMPLETED, mine[-1]
    deltas = [e["delta"] for e in mine if e["type"] == DELTA]
    assert deltas and "".join(deltas) == mine[-1]["transcript"] == expected
    return mine


def test_commit_mode_streams_deltas_while_the_audio_is_still_arriving(server, streamed):
    """Two turns committed by hand. Half of the first turn's audio is sent, and a delta for its item comes back
    before the rest is sent; the item id is the one the commit then names."""
    audio = load_audio(JFK)
    pcms = [pcm16_24k(audio), pcm16_24k(audio[16_000 * 2 : 16_000 * 7])]

    async def session() -> tuple[list[dict], list[dict]]:
        async with connect(server, "ga") as conn:
            await next_event(conn, "ga")
            await update(conn, "ga", turn_detection=None)
            half = len(pcms[0]) // 2 // APPEND_BYTES * APPEND_BYTES
            await send_audio(conn, pcms[0][:half])
            early = [await next_event(conn, "ga")]
            while early[-1]["type"] != DELTA:
                early.append(await next_event(conn, "ga"))
            await send_audio(conn, pcms[0][half:])
            await conn.input_audio_buffer.commit()
            await send_audio(conn, pcms[1])
            await conn.input_audio_buffer.commit()
            return early, early + await events_until_done(conn, {early[-1]["item_id"]})

    early, events = asyncio.run(session())
    committed = [e for e in events if e["type"] == "input_audio_buffer.committed"]
    assert [c["previous_item_id"] for c in committed] == [None, committed[0]["item_id"]]
    assert early[-1]["item_id"] == committed[0]["item_id"]  # the delta came before the commit, for its item
    for pcm, event in zip(pcms, committed, strict=True):
        mine = check_streamed_turn(events, event["item_id"], streamed(as_served(pcm)))
        assert mine[-1]["usage"]["seconds"] == pytest.approx(len(pcm) / 48_000, abs=1e-3)
    completed = [e["item_id"] for e in events if e["type"] == COMPLETED]
    assert completed == [c["item_id"] for c in committed]  # in turn order
    wait_until(lambda: metrics(server)["oasr_realtime_sessions"] == 0, "the session to close")
    m = metrics(server)
    assert m["oasr_engine_streams_active"] == 0 and m["oasr_engine_stream_slots"] > 0
    assert m["oasr_realtime_delta_seconds_count"] >= sum(e["type"] == DELTA for e in events)
    assert m["oasr_realtime_completion_seconds_count"] >= 2
    assert m["oasr_realtime_audio_seconds_total"] >= sum(len(p) for p in pcms) / 48_000 - 1e-6


def test_server_vad_turns_stream_from_speech_start_and_complete_as_the_engine_streams_them(server, streamed):
    """0.7 s of silence, JFK, 1.5 s of silence: Silero finds the turns; each one's deltas come between its
    speech_started and its completed, and its transcript is the streaming engine's for the samples the turn
    covers (``audio_start_ms`` to ``audio_end_ms``)."""
    silence = [np.zeros(int(s * 16_000), np.float32) for s in (0.7, 1.5)]
    pcm = pcm16_24k(np.concatenate([silence[0], load_audio(JFK), silence[1]]))

    async def session() -> list[dict]:
        async with connect(server, "ga") as conn:
            await next_event(conn, "ga")
            await update(conn, "ga", turn_detection=VAD)
            await send_audio(conn, pcm)
            return await events_until_done(conn)

    events = asyncio.run(session())
    heard = as_served(pcm)
    started = [e for e in events if e["type"] == "input_audio_buffer.speech_started"]
    assert started
    streamed_before_stop = False
    for start_event in started:
        mine = item_events(events, start_event["item_id"])
        kinds = [e["type"] for e in mine]
        assert kinds[0] == "input_audio_buffer.speech_started" and kinds[-1] == COMPLETED
        assert kinds.index("input_audio_buffer.speech_stopped") < kinds.index("input_audio_buffer.committed")
        streamed_before_stop |= kinds.index(DELTA) < kinds.index("input_audio_buffer.speech_stopped")
        start_ms = mine[0]["audio_start_ms"]
        end_ms = next(e for e in mine if e["type"] == "input_audio_buffer.speech_stopped")["audio_end_ms"]
        check_streamed_turn(events, start_event["item_id"], streamed(heard[start_ms * 16 : end_ms * 16]))
    assert streamed_before_stop, "no turn's text came while it was being spoken"


def test_a_client_that_leaves_mid_turn_frees_its_stream_slot(server):
    pcm = pcm16_24k(load_audio(JFK))

    async def leave_after_first_delta() -> float:
        async with connect(server, "ga") as conn:
            await next_event(conn, "ga")
            await update(conn, "ga", turn_detection=None)
            await send_audio(conn, pcm[: len(pcm) // 2 // APPEND_BYTES * APPEND_BYTES])
            while (await next_event(conn, "ga"))["type"] != DELTA:
                pass
            return metrics(server)["oasr_engine_streams_active"]

    assert asyncio.run(leave_after_first_delta()) == 1  # the turn's stream, open while the client was there
    wait_until(lambda: metrics(server)["oasr_engine_streams_active"] == 0, "the stream's slot to be freed")
    wait_until(lambda: metrics(server)["oasr_realtime_sessions"] == 0, "the session to close")


@pytest.fixture(scope="module")
def one_stream_server(checkpoint) -> str:
    """An engine core with a single stream slot."""
    spec = EngineCoreSpec(str(checkpoint), "cpu", "float32", SMALL_ENGINE, cpu_threads=1,
                          streaming=StreamingConfig(max_streams=1))
    engine = MPClient(spec)
    try:
        with running_server(build_app(engine, ServerSettings(served_model_name=checkpoint.name,
                                                             api_keys=(API_KEY,)))) as url:
            yield url
    finally:
        engine.shutdown()


def test_a_turn_with_no_free_stream_fails_with_a_clear_error_and_the_next_one_streams(one_stream_server, streamed):
    url = one_stream_server
    audio = load_audio(JFK)[: 16_000 * 4]
    pcm = pcm16_24k(audio)

    async def sessions() -> tuple[list[dict], list[dict]]:
        async with connect(url, "ga") as holder, connect(url, "ga") as other:
            for conn in (holder, other):
                await next_event(conn, "ga")
                await update(conn, "ga", turn_detection=None)
            await send_audio(holder, pcm[: APPEND_BYTES * 10])  # holds the one slot from its first append on
            while (await next_event(holder, "ga"))["type"] != DELTA:
                pass
            await send_audio(other, pcm)
            await other.input_audio_buffer.commit()
            refused = await events_until_done(other)
            await send_audio(holder, pcm[APPEND_BYTES * 10 :])
            await holder.input_audio_buffer.commit()
            held = await events_until_done(holder)
            await send_audio(other, pcm)  # the slot is free again
            await other.input_audio_buffer.commit()
            return refused, held + await events_until_done(other)

    refused, later = asyncio.run(sessions())
    failed = [e for e in refused if e["type"] == FAILED]
    assert len(failed) == 1 and failed[0]["error"]["code"] == "too_many_streams"
    assert "stream slots are taken" in failed[0]["error"]["message"]
    completed = [e for e in later if e["type"] == COMPLETED]
    assert [c["transcript"] for c in completed] == [streamed(as_served(pcm))] * 2


def test_the_in_process_engine_thread_streams_turns_the_same(checkpoint, streamed):
    """``--engine-mode thread``: the same turn, through the engine thread's streams."""
    from oasr.serving.app import start_engine

    engine = start_engine(str(checkpoint), mode="thread", device="cpu", dtype="float32", config=SMALL_ENGINE)
    pcm = pcm16_24k(load_audio(JFK)[: 16_000 * 5])

    async def session(url: str) -> list[dict]:
        async with connect(url, "ga") as conn:
            await next_event(conn, "ga")
            await update(conn, "ga", turn_detection=None)
            await send_audio(conn, pcm)
            await conn.input_audio_buffer.commit()
            return await events_until_done(conn)

    try:
        with running_server(build_app(engine, ServerSettings(served_model_name=checkpoint.name,
                                                             api_keys=(API_KEY,)))) as url:
            events = asyncio.run(session(url))
            committed = next(e for e in events if e["type"] == "input_audio_buffer.committed")
            check_streamed_turn(events, committed["item_id"], streamed(as_served(pcm)))
            wait_until(lambda: metrics(url)["oasr_engine_streams_active"] == 0, "the stream to end")
    finally:
        engine.shutdown()


def _worker_that_dies(spec: EngineCoreSpec, channel, core_pid: int, audio: np.ndarray) -> None:
    """An API worker that opens a stream, hears its first event, and dies without a word to the core."""
    client = MPClient.attach(spec, channel, core_pid, worker_id=1)
    # The core dialled this channel before the worker bound it; it redials every 100 ms (ZeroMQ's default).
    time.sleep(1.0)

    async def stream() -> None:
        live = client.open_stream(StreamOptions())
        live.push(audio)
        async for _ in live.events():
            break

    asyncio.run(stream())
    os._exit(0)


def test_a_worker_process_that_dies_has_its_streams_aborted_by_the_core(checkpoint):
    """One stream slot, two workers: the one that dies held it; the survivor's stream opens once the core has
    seen the dead worker's channel drop (it would be refused for good otherwise)."""
    import multiprocessing

    from oasr.hosting.mp import SharedEngineCore
    from oasr.streaming.types import StreamCapacityError

    spec = EngineCoreSpec(str(checkpoint), "cpu", "float32", SMALL_ENGINE, cpu_threads=1,
                          streaming=StreamingConfig(max_streams=1))
    core = SharedEngineCore(spec, 2)
    audio = load_audio(JFK)[: 16_000 * 3]
    try:
        survivor = MPClient.attach(spec, core.channels[0], core.pid, worker_id=0)
        worker = multiprocessing.get_context("spawn").Process(
            target=_worker_that_dies, args=(spec, core.channels[1], core.pid, audio))
        worker.start()
        worker.join(timeout=WAIT_S)
        assert worker.exitcode == 0  # it heard its stream's first event: the slot was its

        async def stream_once_the_slot_is_free() -> tuple[int, list]:
            for attempt in range(int(WAIT_S / 0.2)):
                live = survivor.open_stream(StreamOptions())
                live.push(audio)
                live.close()
                try:
                    return attempt, [e async for e in live.events()]
                except StreamCapacityError:
                    await asyncio.sleep(0.2)
            raise AssertionError("the dead worker's stream slot was never freed")

        _, events = asyncio.run(stream_once_the_slot_is_free())
        assert events[-1].closed and events[-1].token_ids
        survivor.shutdown()
    finally:
        core.stop()
