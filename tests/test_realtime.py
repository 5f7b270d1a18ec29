"""``/v1/realtime?intent=transcription`` end to end: a real server on loopback, tiny.en on CPU, driven by the
official ``openai`` client's realtime API in both dialects (GA ``client.realtime``, beta ``client.beta.realtime``).

Every completed transcript is compared with ``oasr.transcribe`` on the same samples: the 24 kHz PCM16 sent,
resampled to 16 kHz as the server resamples it (soxr; its streaming resampler gives the same samples as one
pass), cut where the turn was cut. Every GA event received is validated against the SDK's own event types.
"""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path

import numpy as np
import pytest
import soxr
import websockets
from openai import AsyncOpenAI
from openai.types.beta.realtime import RealtimeServerEvent as BetaServerEvent
from openai.types.realtime import RealtimeServerEvent
from pydantic import TypeAdapter

import oasr
from oasr.audio import load_audio
from oasr.serving.app import build_app
from oasr.serving.settings import ServerSettings
from serving_harness import SlowEngine, WAIT_S, engine_idle, metrics, running_server, small_engine, wait_until
from speech_data import audio_path, manifest_entries, require_speech_data

JFK = Path(oasr.__file__).parent / "assets" / "jfk.flac"
API_KEY = "test-key"
APPEND_BYTES = 4800  # 100 ms of 24 kHz PCM16 per append
GA_EVENTS = TypeAdapter(RealtimeServerEvent)
BETA_EVENTS = TypeAdapter(BetaServerEvent)
# Two clips whose speech fills them edge to edge once cut to their loud part (see ``speech_extent``), by
# different speakers: the truth of where speech starts and stops is where the test puts them.
VAD_CLIPS = ("coqui_ljspeech_LJ001-0002", "picovoice_leopard_en")
VAD = {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300, "silence_duration_ms": 500}
TOLERANCE_MS = 100


def settings() -> ServerSettings:
    return ServerSettings(served_model_name="tiny.en", api_keys=(API_KEY,), request_timeout_s=300)


@pytest.fixture(scope="module")
def engine():
    engine = small_engine("tiny.en")
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def server(engine) -> str:
    served = settings()
    with running_server(build_app(engine, served), ws_max_size=served.realtime.max_frame_bytes) as url:
        yield url


def pcm16_24k(samples: np.ndarray) -> bytes:
    """16 kHz float samples as a client sends them: 24 kHz 16-bit little-endian."""
    return (np.clip(soxr.resample(samples, 16_000, 24_000), -1, 1) * 32767).round().astype("<i2").tobytes()


def as_served(pcm: bytes) -> np.ndarray:
    """What the server hears of ``pcm``: its samples at 16 kHz."""
    return soxr.resample(np.frombuffer(pcm, "<i2").astype(np.float32) / 32768, 24_000, 16_000)


def offline(tiny_en, audio: np.ndarray) -> str:
    return oasr.transcribe([audio], model=tiny_en)[0].text


def speech_extent(samples: np.ndarray) -> np.ndarray:
    """The clip from its first to its last 20 ms frame within 20 dB of its loudest."""
    frames = samples[: len(samples) // 320 * 320].reshape(-1, 320)
    level = 10 * np.log10((frames**2).mean(axis=1) + 1e-12)
    loud = np.flatnonzero(level > level.max() - 20)
    return samples[loud[0] * 320 : (loud[-1] + 1) * 320]


def clip(entry_id: str) -> np.ndarray:
    require_speech_data()
    entry = next(e for e in manifest_entries() if e["id"] == entry_id)
    return load_audio(audio_path(entry))


def connect(base_url: str, dialect: str, api_key: str = API_KEY):
    # The beta client always dials wss:// from base_url; websocket_base_url (an SDK option) says ws://.
    openai = AsyncOpenAI(base_url=f"{base_url}/v1", api_key=api_key, max_retries=0,
                         websocket_base_url=base_url.replace("http://", "ws://") + "/v1")
    if dialect == "beta":
        return openai.beta.realtime.connect(model="whisper-1", extra_query={"intent": "transcription"})
    return openai.realtime.connect(extra_query={"intent": "transcription"})


async def update(conn, dialect: str, *, turn_detection: dict | None, audio_format: str = "pcm16") -> dict:
    """The session's turn detection (and format) set through the dialect's own update; its answer."""
    if dialect == "beta":
        await conn.transcription_session.update(session={"input_audio_format": audio_format,
                                                         "turn_detection": turn_detection})
    else:
        fmt = {"pcm16": {"type": "audio/pcm", "rate": 24_000}, "g711_ulaw": {"type": "audio/pcmu"},
               "g711_alaw": {"type": "audio/pcma"}}[audio_format]
        await conn.session.update(session={"type": "transcription",
                                           "audio": {"input": {"format": fmt, "turn_detection": turn_detection}}})
    return await next_event(conn, dialect)


def turn_detection_of(event: dict, dialect: str) -> dict | None:
    session = event["session"]
    return session["turn_detection"] if dialect == "beta" else session["audio"]["input"]["turn_detection"]


async def next_event(conn, dialect: str) -> dict:
    event = json.loads(await asyncio.wait_for(conn.recv_bytes(), WAIT_S))
    if dialect == "ga":
        GA_EVENTS.validate_python(event)  # the SDK's own types accept it as sent
    elif not event["type"].startswith("transcription_session."):  # the beta session also names a client secret
        BETA_EVENTS.validate_python(event)
    return event


async def send_audio(conn, pcm: bytes) -> None:
    for start in range(0, len(pcm), APPEND_BYTES):
        await conn.input_audio_buffer.append(audio=base64.b64encode(pcm[start : start + APPEND_BYTES]).decode())


async def events_until(conn, dialect: str, num_done: int) -> list[dict]:
    """Events up to the ``num_done``-th finished transcript (completed or failed)."""
    events = []
    while num_done:
        events.append(await next_event(conn, dialect))
        num_done -= events[-1]["type"].endswith((".completed", ".failed"))
    return events


def item_events(events: list[dict], item_id: str) -> list[dict]:
    return [e for e in events if e.get("item_id") == item_id]


def check_transcript(events: list[dict], item_id: str, expected: str) -> dict:
    """The item's deltas join to its completed transcript, which is ``expected``."""
    mine = item_events(events, item_id)
    completed = mine[-1]
    assert completed["type"] == "conversation.item.input_audio_transcription.completed", completed
    deltas = [e["delta"] for e in mine if e["type"].endswith(".delta")]
    assert "".join(deltas) == completed["transcript"] == expected
    return completed


# ------------------------------------------------------------------------------------ commit mode

@pytest.mark.parametrize("dialect", ["ga", "beta"])
def test_committed_turns_are_transcribed_as_offline_transcribes_them(server, tiny_en, dialect):
    """Two turns in one session, committed by hand: jfk, then a clip of the shared set."""
    clips = [load_audio(JFK), clip("ps_librivox_0880")]
    pcms = [pcm16_24k(c) for c in clips]

    async def session() -> tuple[dict, list[dict]]:
        async with connect(server, dialect) as conn:
            created = await next_event(conn, dialect)
            updated = await update(conn, dialect, turn_detection=None)
            assert turn_detection_of(updated, dialect) is None
            events = []
            for pcm in pcms:
                await send_audio(conn, pcm)
                await conn.input_audio_buffer.commit()
                events += await events_until(conn, dialect, 1)
            return created, events

    created, events = asyncio.run(session())
    assert created["type"] == ("session.created" if dialect == "ga" else "transcription_session.created")
    committed = [e for e in events if e["type"] == "input_audio_buffer.committed"]
    assert [c["previous_item_id"] for c in committed] == [None, committed[0]["item_id"]]
    for pcm, event in zip(pcms, committed, strict=True):
        completed = check_transcript(events, event["item_id"], offline(tiny_en, as_served(pcm)))
        assert completed["usage"] == {"type": "duration", "seconds": pytest.approx(len(pcm) / 48_000, abs=1e-3)}
    wait_until(lambda: metrics(server)["oasr_realtime_sessions"] == 0, "the session to close")
    m = metrics(server)
    assert m["oasr_realtime_audio_seconds_total"] >= sum(len(p) for p in pcms) / 48_000 - 1e-6
    assert m["oasr_realtime_completion_seconds_count"] >= 2


def test_g711_input_is_decoded_and_transcribed(server, tiny_en):
    """A-law at 8 kHz (GA audio/pcma): the server decodes and upsamples it; offline hears the same samples."""
    from oasr.serving.realtime.audio import codec

    samples = load_audio(JFK)
    linear = np.clip(soxr.resample(samples, 16_000, 8_000), -1, 1)
    table = codec("g711_alaw").table
    alaw = np.abs(linear[:, None] - table[None, :]).argmin(axis=1).astype(np.uint8).tobytes()  # nearest code
    heard = soxr.resample(table[np.frombuffer(alaw, np.uint8)], 8_000, 16_000)

    async def session() -> list[dict]:
        async with connect(server, "ga") as conn:
            await next_event(conn, "ga")
            updated = await update(conn, "ga", turn_detection=None, audio_format="g711_alaw")
            assert updated["session"]["audio"]["input"]["format"] == {"type": "audio/pcma"}
            for start in range(0, len(alaw), 800):
                await conn.input_audio_buffer.append(audio=base64.b64encode(alaw[start : start + 800]).decode())
            await conn.input_audio_buffer.commit()
            return await events_until(conn, "ga", 1)

    events = asyncio.run(session())
    check_transcript(events, events[0]["item_id"], offline(tiny_en, heard))


# ------------------------------------------------------------------------------------ server VAD

@pytest.mark.parametrize("dialect", ["ga", "beta"])
def test_server_vad_finds_two_utterances_where_they_are(server, tiny_en, dialect):
    """0.7 s of silence, utterance A, 1 s of silence, utterance B, 1.5 s of silence. OpenAI's times:
    ``audio_start_ms`` includes the prefix padding, ``audio_end_ms`` the silence that ended the turn."""
    utterances = [speech_extent(clip(name)) for name in VAD_CLIPS]
    silence = [np.zeros(int(s * 16_000), np.float32) for s in (0.7, 1.0, 1.5)]
    audio = np.concatenate([silence[0], utterances[0], silence[1], utterances[1], silence[2]])
    starts_s = [0.7, 0.7 + len(utterances[0]) / 16_000 + 1.0]
    truth = [(start, start + len(u) / 16_000) for start, u in zip(starts_s, utterances, strict=True)]
    pcm = pcm16_24k(audio)

    async def session() -> list[dict]:
        async with connect(server, dialect) as conn:
            await next_event(conn, dialect)
            updated = await update(conn, dialect, turn_detection=VAD)
            assert turn_detection_of(updated, dialect) == VAD
            await send_audio(conn, pcm)
            return await events_until(conn, dialect, 2)

    events = asyncio.run(session())
    heard = as_served(pcm)
    started = [e for e in events if e["type"] == "input_audio_buffer.speech_started"]
    assert len(started) == 2
    for (speech_start, speech_end), start_event in zip(truth, started, strict=True):
        mine = item_events(events, start_event["item_id"])
        assert [e["type"] for e in mine[:3]] == ["input_audio_buffer.speech_started",
                                                 "input_audio_buffer.speech_stopped", "input_audio_buffer.committed"]
        start_ms, end_ms = mine[0]["audio_start_ms"], mine[1]["audio_end_ms"]
        assert abs(start_ms - (speech_start * 1000 - VAD["prefix_padding_ms"])) <= TOLERANCE_MS
        assert abs(end_ms - (speech_end * 1000 + VAD["silence_duration_ms"])) <= TOLERANCE_MS
        check_transcript(events, start_event["item_id"], offline(tiny_en, heard[start_ms * 16 : end_ms * 16]))


# ------------------------------------------------------------------------------------ bad input, limits

def test_bad_events_get_error_events_and_the_session_goes_on(server, tiny_en):
    pcm = pcm16_24k(load_audio(JFK))

    async def session() -> tuple[list[dict], list[dict]]:
        async with connect(server, "ga") as conn:
            await next_event(conn, "ga")
            await update(conn, "ga", turn_detection=None)
            errors = []
            await conn.send({"type": "input_audio_buffer.bogus", "event_id": "evt_unknown"})
            errors.append(await next_event(conn, "ga"))
            await conn.input_audio_buffer.append(audio="this is not base64!", event_id="evt_base64")
            errors.append(await next_event(conn, "ga"))
            await conn.send({"type": "session.update", "event_id": "evt_rate", "session": {
                "type": "transcription", "audio": {"input": {"format": {"type": "audio/pcm", "rate": 16_000}}}}})
            errors.append(await next_event(conn, "ga"))
            await conn.input_audio_buffer.append(audio=base64.b64encode(b"\x00\x01\x02").decode(),
                                                 event_id="evt_odd")  # half a PCM16 sample too many
            errors.append(await next_event(conn, "ga"))
            big = base64.b64encode(bytes(15 << 20)).decode()  # a 20 MiB event, over OpenAI's 15 MiB
            await conn.input_audio_buffer.append(audio=big, event_id="evt_big")
            errors.append(await next_event(conn, "ga"))
            await conn.input_audio_buffer.commit(event_id="evt_empty")
            errors.append(await next_event(conn, "ga"))
            # The session still works, with its settings unchanged (24 kHz PCM16).
            await send_audio(conn, pcm)
            await conn.input_audio_buffer.commit()
            return errors, await events_until(conn, "ga", 1)

    errors, events = asyncio.run(session())
    assert [e["type"] for e in errors] == ["error"] * 6
    assert [e["error"]["event_id"] for e in errors] == ["evt_unknown", "evt_base64", "evt_rate", "evt_odd",
                                                        "evt_big", "evt_empty"]
    assert [e["error"]["code"] for e in errors] == ["unknown_event_type", "invalid_base64", "invalid_value",
                                                    "invalid_audio_format", "event_too_large",
                                                    "input_audio_buffer_commit_empty"]
    assert errors[2]["error"]["param"] == "session.audio.input.format.rate"
    assert all(e["error"]["type"] == "invalid_request_error" and e["error"]["message"] for e in errors)
    check_transcript(events, events[0]["item_id"], offline(tiny_en, as_served(pcm)))


@pytest.mark.parametrize("key", [None, "wrong-key"])
def test_a_missing_or_wrong_api_key_is_refused_before_the_socket_opens(server, key):
    async def attempt() -> int:
        url = server.replace("http://", "ws://") + "/v1/realtime?intent=transcription"
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
            async with websockets.connect(url, additional_headers=headers):
                pass
        return refused.value.response.status_code, json.loads(refused.value.response.body)

    status, body = asyncio.run(attempt())
    assert status == 401 and body["error"]["code"] == "invalid_api_key"


def test_the_official_client_with_a_wrong_key_cannot_connect(server):
    async def attempt() -> None:
        async with connect(server, "ga", api_key="wrong-key") as conn:
            await conn.recv_bytes()

    with pytest.raises(Exception) as refused:
        asyncio.run(attempt())
    assert "401" in str(refused.value)


# ------------------------------------------------------------------------------------ a dropped socket

def test_a_dropped_socket_aborts_its_turn_in_the_engine(engine):
    """The engine made slow (400 tokens a window): the client leaves after the first delta; the turn's engine
    request is aborted (its output iterator closed early) and the engine goes idle."""
    slow = SlowEngine(engine)
    served = settings()
    with running_server(build_app(slow, served)) as url:
        async def leave_after_first_delta() -> None:
            async with connect(url, "ga") as conn:
                await next_event(conn, "ga")
                await update(conn, "ga", turn_detection=None)
                await send_audio(conn, pcm16_24k(load_audio(JFK)))
                await conn.input_audio_buffer.commit()
                while (await next_event(conn, "ga"))["type"] != "conversation.item.input_audio_transcription.delta":
                    pass

        asyncio.run(leave_after_first_delta())
        wait_until(lambda: slow.num_closed_early == 1, "the turn's engine request to be aborted")
        wait_until(lambda: engine_idle(url) and metrics(url)["oasr_realtime_sessions"] == 0, "the engine to idle")
    assert slow.num_finished == 0


# ------------------------------------------------------------------------------------ the handshake's other checks

@pytest.fixture(scope="module")
def small_server(engine) -> str:
    """One session at a time, closed after 2 s without a client event."""
    from dataclasses import replace

    from oasr.serving.settings import RealtimeSettings

    served = replace(settings(), realtime=RealtimeSettings(max_sessions=1, idle_timeout_s=2))
    with running_server(build_app(engine, served), ws_max_size=served.realtime.max_frame_bytes) as url:
        yield url


async def refused(url: str, path: str = "/v1/realtime?intent=transcription", **headers: str) -> tuple[int, dict]:
    with pytest.raises(websockets.exceptions.InvalidStatus) as refusal:
        async with websockets.connect(url.replace("http://", "ws://") + path,
                                      additional_headers={"Authorization": f"Bearer {API_KEY}", **headers}):
            pass
    response = refusal.value.response
    return response.status_code, json.loads(response.body)


def test_sessions_past_the_cap_are_refused_with_429_until_one_closes(small_server):
    async def attempt() -> tuple[int, dict]:
        async with connect(small_server, "ga") as conn:
            await next_event(conn, "ga")
            refusal = await refused(small_server)
        wait_until(lambda: metrics(small_server)["oasr_realtime_sessions"] == 0, "the session to close")
        async with connect(small_server, "ga") as conn:  # its place is free again
            assert (await next_event(conn, "ga"))["type"] == "session.created"
        return refusal

    status, body = asyncio.run(attempt())
    assert status == 429 and body["error"]["code"] == "too_many_sessions"


def test_a_page_from_another_origin_and_a_socket_without_the_intent_are_refused(small_server):
    status, body = asyncio.run(refused(small_server, Origin="https://elsewhere.example"))
    assert status == 403 and body["error"]["code"] == "origin_not_allowed"
    status, body = asyncio.run(refused(small_server, "/v1/realtime?model=gpt-realtime"))
    assert status == 400 and body["error"]["param"] == "intent"


def test_a_silent_client_is_told_and_closed_after_the_idle_timeout(small_server):
    async def wait_silently() -> tuple[dict, int]:
        url = small_server.replace("http://", "ws://") + "/v1/realtime?intent=transcription"
        async with websockets.connect(url, additional_headers={"Authorization": f"Bearer {API_KEY}"}) as socket:
            assert json.loads(await socket.recv())["type"] == "session.created"
            error = json.loads(await asyncio.wait_for(socket.recv(), 30))
            with pytest.raises(websockets.exceptions.ConnectionClosed) as closed:
                await asyncio.wait_for(socket.recv(), 30)
            return error, closed.value.rcvd.code

    error, code = asyncio.run(wait_silently())
    assert error["type"] == "error" and error["error"]["code"] == "idle_timeout" and code == 1000
