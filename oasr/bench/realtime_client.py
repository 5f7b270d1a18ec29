"""The realtime bench's clients: N sessions on one event loop, each speaking OpenAI's GA Realtime protocol to
``/v1/realtime?intent=transcription`` with the ``websockets`` library (no SDK: at hundreds of sessions its
per-event model validation would cost more than the server's work being measured).

A session sends one ``session.update`` (transcription, ``audio/pcm`` at 24 kHz, ``turn_detection: null``: the
client commits), then speaks its turns one after the other: a turn's appends go out one chunk per chunk period
(divided by the speed), the commit when its audio's last chunk period ends, and the next turn starts once the
turn's ``completed`` (or ``failed``) has come. Every timestamp is ``time.perf_counter()``.

One event loop keeps a few dozen sessions on time; at hundreds it falls behind, and every append it sends late
and every event it reads late shows up as the server's latency. ``run_load(plan, processes=N)`` splits the
sessions over N client processes, each with its own loop (the perf counter is the host's monotonic clock, so
their timestamps compare).
"""

from __future__ import annotations

import asyncio
import base64
import json
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

import numpy as np

PCM_RATE = 24_000  # the GA protocol's audio/pcm rate
PCM_BYTES = 2  # 16-bit little-endian
ENGINE_RATE = 16_000  # the rate the bench's audio is loaded at (the server resamples to it too)
DELTA = "conversation.item.input_audio_transcription.delta"
COMPLETED = "conversation.item.input_audio_transcription.completed"
FAILED = "conversation.item.input_audio_transcription.failed"
SESSION_UPDATE = json.dumps({"type": "session.update", "session": {
    "type": "transcription",
    "audio": {"input": {"format": {"type": "audio/pcm", "rate": PCM_RATE}, "turn_detection": None}}}})
COMMIT = json.dumps({"type": "input_audio_buffer.commit"})
CLIENT_START_S = 3.0  # client processes start this long after they are asked for (a spawn and its imports)


@dataclass(frozen=True)
class Utterance:
    """One clip as a turn sends it: its append events, ready to go, one per chunk."""

    name: str
    appends: tuple[str, ...]
    audio_s: float


def utterance(name: str, samples: np.ndarray, chunk_ms: int) -> Utterance:
    """16 kHz float samples -> the 24 kHz PCM16 appends of ``chunk_ms`` each (the last one shorter)."""
    import soxr

    pcm = (np.clip(soxr.resample(samples, ENGINE_RATE, PCM_RATE), -1, 1) * 32767).round().astype("<i2").tobytes()
    chunk_bytes = PCM_RATE * chunk_ms // 1000 * PCM_BYTES
    appends = tuple(json.dumps({"type": "input_audio_buffer.append",
                                "audio": base64.b64encode(pcm[i : i + chunk_bytes]).decode()})
                    for i in range(0, len(pcm), chunk_bytes))
    return Utterance(name, appends, len(pcm) / PCM_BYTES / PCM_RATE)


@dataclass(frozen=True)
class LoadPlan:
    ws_url: str  # ws://host:port/v1/realtime?intent=transcription
    utterances: tuple[Utterance, ...]
    num_sessions: int
    num_turns: int | None  # per session; None: until the deadline
    duration_s: float | None  # no turn starts after this many seconds (None: no deadline)
    chunk_s: float  # audio seconds per append
    speed: float  # audio seconds sent per wall second
    turn_timeout_s: float  # a turn with no completed this long after its commit has failed
    stagger_s: float  # sessions start spread over this long

    @property
    def chunk_wall_s(self) -> float:
        return self.chunk_s / self.speed


@dataclass
class Turn:
    utterance: int  # index into the plan's utterances
    first_append_at: float | None = None
    last_append_at: float | None = None
    commit_at: float | None = None
    item_id: str | None = None  # from input_audio_buffer.committed
    delta_item_ids: set[str] = field(default_factory=set)
    delta_times: list[float] = field(default_factory=list)  # when each delta arrived
    delta_after_append_s: list[float] = field(default_factory=list)  # each delta's arrival - the last append's send
    transcript: str | None = None
    completed_at: float | None = None
    failure: str | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def completed(self) -> bool:
        return self.completed_at is not None and self.failure is None

    def __getstate__(self) -> dict:  # the event belongs to the client process's loop: a turn crosses without it
        return {k: v for k, v in self.__dict__.items() if k != "done"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, done=asyncio.Event())


@dataclass
class SessionRecord:
    index: int
    turns: list[Turn] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # error events, failed turns, socket failures
    audio_sent_s: float = 0.0
    max_lateness_s: float = 0.0  # the latest an append went out after its due time
    num_late_appends: int = 0  # appends more than one chunk period late
    ready: asyncio.Event = field(default_factory=asyncio.Event)  # session.updated has come

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "ready"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, ready=asyncio.Event())


async def run_load(plan: LoadPlan, *, processes: int = 1) -> tuple[list[SessionRecord], float]:
    """Every session of ``plan`` -> their records (by index) and the wall seconds from the load's start to the
    last session's end; ``processes`` > 1: the sessions dealt round-robin to that many client processes, which
    share one start (the stagger and the deadline count from it) a little ahead, to cover their start-up."""
    if processes < 1:
        raise ValueError(f"processes must be at least 1, got {processes}")
    if processes == 1:
        origin = time.perf_counter()
        return await _sessions(plan, range(plan.num_sessions), origin), time.perf_counter() - origin
    origin = time.perf_counter() + CLIENT_START_S
    loop = asyncio.get_running_loop()
    # spawn: the parent may hold threads (torch's, the server's pipes) that a forked child must not inherit.
    with ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn")) as pool:
        parts = await asyncio.gather(*(loop.run_in_executor(pool, _client_process, plan,
                                                            range(i, plan.num_sessions, processes), origin)
                                       for i in range(min(processes, plan.num_sessions))),
                                     return_exceptions=True)  # the others' sessions run to their end first
    wall_s = time.perf_counter() - origin
    failed = [p for p in parts if isinstance(p, BaseException)]
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(parts)} client processes failed") from failed[0]
    return sorted((r for part in parts for r in part), key=lambda r: r.index), wall_s


def _client_process(plan: LoadPlan, indices: range, origin: float) -> list[SessionRecord]:
    return asyncio.run(_sessions(plan, indices, origin))


async def _sessions(plan: LoadPlan, indices: range, origin: float) -> list[SessionRecord]:
    """The sessions of ``indices`` on this loop, each starting at its place in the plan's stagger after
    ``origin`` (perf-counter seconds), none starting a turn after the plan's duration from it."""
    records = [SessionRecord(i) for i in indices]
    deadline = None if plan.duration_s is None else origin + plan.duration_s
    await asyncio.gather(*(_session(plan, r, origin + plan.stagger_s * r.index / plan.num_sessions, deadline)
                           for r in records))
    return records


async def _session(plan: LoadPlan, record: SessionRecord, start_at: float, deadline: float | None) -> None:
    from websockets.asyncio.client import connect
    from websockets.exceptions import WebSocketException

    await asyncio.sleep(max(start_at - time.perf_counter(), 0.0))
    try:
        # No pings from this side (a loop busy with hundreds of sessions could miss their answers) and no
        # compression (base64 PCM hardly compresses; deflating it would load both ends).
        async with connect(plan.ws_url, max_size=None, ping_interval=None, compression=None,
                           open_timeout=plan.turn_timeout_s) as ws:
            reader = asyncio.create_task(_read(ws, record))
            await ws.send(SESSION_UPDATE)
            if await _until(record.ready, reader, plan.turn_timeout_s):
                num_turns = 0
                while plan.num_turns is None or num_turns < plan.num_turns:
                    if deadline is not None and time.perf_counter() >= deadline:
                        break
                    if not await _speak(ws, plan, record, (record.index + num_turns) % len(plan.utterances),
                                        reader):
                        break
                    num_turns += 1
            else:
                record.errors.append(f"session {record.index}: no session.updated: {_reader_failure(reader)}")
            reader.cancel()
    except (OSError, TimeoutError, WebSocketException) as exc:
        record.errors.append(f"session {record.index}: {type(exc).__name__}: {exc}")


async def _speak(ws, plan: LoadPlan, record: SessionRecord, index: int, reader: asyncio.Task) -> bool:
    """One turn: its appends paced, its commit, its completed awaited; False if it failed."""
    spoken = plan.utterances[index]
    turn = Turn(index)
    record.turns.append(turn)
    start = time.perf_counter()
    for k, append in enumerate(spoken.appends):
        due = start + k * plan.chunk_wall_s
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        late = time.perf_counter() - due
        record.max_lateness_s = max(record.max_lateness_s, late)
        record.num_late_appends += late > plan.chunk_wall_s
        await ws.send(append)
        turn.last_append_at = time.perf_counter()
        turn.first_append_at = turn.first_append_at or turn.last_append_at
    record.audio_sent_s += spoken.audio_s
    await asyncio.sleep(max(start + spoken.audio_s / plan.speed - time.perf_counter(), 0.0))
    turn.commit_at = time.perf_counter()
    await ws.send(COMMIT)
    if not await _until(turn.done, reader, plan.turn_timeout_s):
        turn.failure = f"no completed within {plan.turn_timeout_s:g} s of the commit: {_reader_failure(reader)}"
    elif turn.failure is None and turn.delta_item_ids - {turn.item_id}:
        turn.failure = f"deltas for items {sorted(turn.delta_item_ids)} in the turn of {turn.item_id}"
    if turn.failure is not None:
        record.errors.append(f"session {record.index} turn {len(record.turns) - 1}: {turn.failure}")
    return turn.failure is None


async def _until(flag: asyncio.Event, reader: asyncio.Task, timeout_s: float) -> bool:
    """Waits for ``flag``; False if the reader ended first (the socket closed) or the timeout passed."""
    waiter = asyncio.ensure_future(flag.wait())
    await asyncio.wait({waiter, reader}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    if not waiter.done():
        waiter.cancel()
    return flag.is_set()


def _reader_failure(reader: asyncio.Task) -> str:
    if not reader.done():
        return "the server sent nothing more"
    if reader.cancelled():
        return "the reader was cancelled"
    exc = reader.exception()
    return f"the socket closed ({type(exc).__name__}: {exc})" if exc else "the socket closed"


async def _read(ws, record: SessionRecord) -> None:
    """Every server event of the session, stamped on arrival and filed with the turn being spoken (turns never
    overlap: the next one starts after this one's completed)."""
    async for message in ws:
        now = time.perf_counter()
        event = json.loads(message)
        kind = event.get("type")
        turn = record.turns[-1] if record.turns else None
        if kind == "session.updated":
            record.ready.set()
        elif kind == "error":
            record.errors.append(f"session {record.index}: error event {json.dumps(event.get('error'))[:300]}")
            if turn is not None and not turn.done.is_set():
                turn.failure = "an error event"
                turn.done.set()
        elif turn is None:
            continue
        elif kind == "input_audio_buffer.committed":
            turn.item_id = event["item_id"]
        elif kind == DELTA:
            turn.delta_item_ids.add(event["item_id"])
            turn.delta_times.append(now)
            if turn.last_append_at is not None:
                turn.delta_after_append_s.append(now - turn.last_append_at)
        elif kind in (COMPLETED, FAILED):
            if kind == FAILED:
                turn.failure = f"failed: {json.dumps(event.get('error'))[:300]}"
            elif event["item_id"] != turn.item_id:
                turn.failure = f"completed {event['item_id']} while waiting for {turn.item_id}"
            turn.transcript = event.get("transcript")
            turn.completed_at = now
            turn.done.set()
