"""The soak's realtime and request-head faults, run beside its uploads: hostile clients of ``/v1/realtime`` and
one of the HTTP front, each expecting the answer the server's limits promise.

- deep_json: a session sends an event nested 5,000 deep and one holding a 5,000-digit integer; each must get an
  ``invalid_json`` error event, and the session must still answer a valid event.
- commit_flood: a session commits short turns as fast as it can; past the server's pending-turn limit commits
  must get ``too_many_pending_turns`` error events, and every committed turn must still be answered.
- session_hog: one address opens sessions past the server's per-client cap; those past it must be refused with
  429 ``too_many_sessions_per_client``.
- header_bomb: a request whose header grows to megabytes must get 431 before the header ends.

All of them talk to the server on loopback only, each bounded by the soak's timeout, a fixed number of rounds.
A fault whose answer never comes is hung; one whose connection drops, or that hears something else, is lost
(unless the planned restart explains it).
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import time
from dataclasses import dataclass

import numpy as np
import websockets

REALTIME_FAULTS = ("deep_json", "commit_flood", "session_hog", "header_bomb")
DEEP_JSON = '{"type": "input_audio_buffer.append", "audio": ' + "[" * 5000 + "]" * 5000 + "}"
LONG_INTEGER = '{"type": "input_audio_buffer.clear", "n": ' + "7" * 5000 + "}"
FLOOD_TURNS = 30  # commits per commit_flood, each of ...
FLOOD_TURN_SAMPLES = 12_000  # ... 0.5 s of 24 kHz PCM16 noise (silence would be answered without a decode)
HOG_SESSIONS_PAST_CAP = 4
DEFAULT_SESSIONS_PER_CLIENT = 16  # oasr serve's --realtime-max-sessions-per-client, which the soak's server keeps
BOMB_BYTES = 8 << 20  # a header line this long, sent until the server answers
_BOMB_CHUNK = 64 << 10
_NO_VAD = {"type": "session.update",
           "session": {"type": "transcription", "audio": {"input": {"turn_detection": None}}}}


class UnexpectedAnswer(Exception):
    """The server answered a fault otherwise than its limits promise."""


@dataclass(frozen=True)
class FaultOutcome:
    kind: str
    outcome: str  # handled, lost, hung or refused_by_restart
    detail: str
    started: float
    ended: float


async def _next_event(ws, timeout_s: float) -> dict:
    return json.loads(await asyncio.wait_for(ws.recv(), timeout_s))


async def _until(ws, wanted: str, timeout_s: float) -> dict:
    """The next event of type ``wanted`` (or an ``error`` when ``wanted`` is an error code)."""
    while True:
        event = await _next_event(ws, timeout_s)
        if event["type"] == wanted or (event["type"] == "error" and event["error"].get("code") == wanted):
            return event
        if event["type"] == "error":
            raise UnexpectedAnswer(f"expected {wanted}, got error {event['error'].get('code')}")


async def deep_json(ws_url: str, http_url: str, timeout_s: float) -> str:
    async with websockets.connect(ws_url, max_size=None) as ws:
        await _until(ws, "session.created", timeout_s)
        for event in (DEEP_JSON, LONG_INTEGER):
            await ws.send(event)
            await _until(ws, "invalid_json", timeout_s)
        await ws.send(json.dumps({"type": "input_audio_buffer.clear"}))
        await _until(ws, "input_audio_buffer.cleared", timeout_s)
    return "2 invalid_json errors, session kept"


async def commit_flood(ws_url: str, http_url: str, timeout_s: float) -> str:
    noise = random.Random(0).randbytes(2 * FLOOD_TURN_SAMPLES)
    pcm = (np.frombuffer(noise, "<i2") // 8).astype("<i2").tobytes()  # -18 dBFS: loud enough to be decoded
    audio = base64.b64encode(pcm).decode()
    async with websockets.connect(ws_url, max_size=None) as ws:
        await _until(ws, "session.created", timeout_s)
        await ws.send(json.dumps(_NO_VAD))
        await _until(ws, "session.updated", timeout_s)
        for _ in range(FLOOD_TURNS):
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))
            await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        num_committed = num_refused = num_answered = 0
        while num_committed + num_refused < FLOOD_TURNS or num_answered < num_committed:
            event = await _next_event(ws, timeout_s)
            kind = event["type"]
            if kind == "input_audio_buffer.committed":
                num_committed += 1
            elif kind == "error" and event["error"].get("code") == "too_many_pending_turns":
                num_refused += 1
            elif kind.endswith((".completed", ".failed")):
                num_answered += 1
            elif kind == "error":
                raise UnexpectedAnswer(f"error {event['error'].get('code')}: {event['error'].get('message')}")
    return f"{num_committed} committed and answered, {num_refused} refused"


async def session_hog(ws_url: str, http_url: str, timeout_s: float) -> str:
    opened, refused = [], 0
    try:
        for _ in range(DEFAULT_SESSIONS_PER_CLIENT + HOG_SESSIONS_PAST_CAP):
            try:
                ws = await asyncio.wait_for(websockets.connect(ws_url), timeout_s)
            except websockets.exceptions.InvalidStatus as exc:
                body = json.loads(exc.response.body)
                if exc.response.status_code != 429 or body["error"]["code"] != "too_many_sessions_per_client":
                    raise UnexpectedAnswer(f"refused with {exc.response.status_code} {body}") from None
                refused += 1
                continue
            opened.append(ws)
            await _until(ws, "session.created", timeout_s)
    finally:
        await asyncio.gather(*(ws.close() for ws in opened), return_exceptions=True)
    if refused < HOG_SESSIONS_PAST_CAP:
        raise UnexpectedAnswer(f"{len(opened)} sessions opened from one address, only {refused} refused")
    return f"{len(opened)} opened, {refused} refused with 429"


async def header_bomb(ws_url: str, http_url: str, timeout_s: float) -> str:
    host, _, port = http_url.removeprefix("http://").rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    sent = 0

    async def send() -> None:
        nonlocal sent
        writer.write(f"GET /health HTTP/1.1\r\nHost: {host}\r\nX-Bomb: ".encode())
        while sent < BOMB_BYTES:
            writer.write(b"a" * _BOMB_CHUNK)
            await writer.drain()
            sent += _BOMB_CHUNK

    sender = asyncio.ensure_future(send())
    try:
        answer = await asyncio.wait_for(reader.read(4096), timeout_s)
    finally:
        sender.cancel()
        await asyncio.gather(sender, return_exceptions=True)
        writer.close()
    if not answer.startswith(b"HTTP/1.1 431 "):
        raise UnexpectedAnswer(f"answered {answer[:40]!r} after {sent} header bytes")
    return f"431 (read once the client had written {sent >> 20} MiB, most of it into socket buffers)"


FAULTS = {"deep_json": deep_json, "commit_flood": commit_flood, "session_hog": session_hog,
          "header_bomb": header_bomb}


async def run_fault(kind: str, http_url: str, timeout_s: float) -> tuple[str, str]:
    """One fault against the server at ``http_url``: (outcome, detail), the outcome ``handled``, ``hung`` or
    ``lost`` (the restart's share is decided by the caller, who knows when it was)."""
    ws_url = http_url.replace("http://", "ws://") + "/v1/realtime?intent=transcription"
    try:
        # Each step waits at most timeout_s; the whole fault at most a few of them.
        return "handled", await asyncio.wait_for(FAULTS[kind](ws_url, http_url, timeout_s), 4 * timeout_s)
    except TimeoutError:
        return "hung", "no answer in time"
    except (UnexpectedAnswer, OSError, websockets.exceptions.WebSocketException) as exc:
        return "lost", f"{type(exc).__name__}: {exc}"[:300]


def summarize_faults(outcomes: list[FaultOutcome]) -> dict[str, dict]:
    rows = {}
    for kind in REALTIME_FAULTS:
        mine = [o for o in outcomes if o.kind == kind]
        rows[kind] = {"sent": len(mine),
                      **{k: sum(o.outcome == k for o in mine) for k in ("handled", "refused_by_restart", "lost",
                                                                       "hung")},
                      "details": sorted({o.detail for o in mine})[:5]}
    return rows


def now() -> float:
    return time.monotonic()
