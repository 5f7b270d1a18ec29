"""Live streams through the engine core's loop logic (no process): the stream messages in, one ``CoreUpdate``
per step out carrying each owner's ``StreamEvent``s, on a tiny random Nemotron streaming checkpoint; slots freed
by aborts and by a client that goes away; a full engine's refusal; the client side's stream and its errors."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

import oasr
from oasr.hosting.core import EngineCore
from oasr.hosting.protocol import (
    INVALID_REQUEST,
    STREAM_CAPACITY,
    AbortStreams,
    AddRequest,
    CloseStream,
    CoreUpdate,
    OpenStream,
    PushAudio,
    StreamFailed,
    dumps,
    loads,
)
from oasr.engine.engine import ASREngine
from oasr.hosting.live_stream import LiveStream, stream_error
from oasr.engine.combined import Engine
from oasr.streaming.types import StreamCapacityError, StreamEvent, StreamingConfig, StreamOptions
from oasr.types import DecodeOptions
from nemotron_reference import build_reference, clips, feature_extractor, reference_features, reference_streamed, save
from serving_harness import SMALL_ENGINE

LOOKAHEAD = 1


@pytest.fixture(scope="module")
def nemotron(tmp_path_factory):
    reference = build_reference()
    loaded = oasr.from_pretrained(save(reference, tmp_path_factory.mktemp("nemotron")), device="cpu",
                                  dtype="float32")
    audio = clips()
    x, lengths = reference_features(feature_extractor(reference.config.encoder_config.num_mel_bins), audio)
    expected = [reference_streamed(reference, x[i : i + 1, : int(n)], LOOKAHEAD) for i, n in enumerate(lengths)]
    return loaded, audio, expected


def make_core(loaded, max_streams: int = 4) -> EngineCore:
    return EngineCore(Engine(loaded, SMALL_ENGINE, StreamingConfig(max_streams=max_streams)))


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def step_until_idle(core: EngineCore, num_clients: int = 1, max_steps: int = 2000) -> list[dict[int, CoreUpdate]]:
    """Every step's updates (as they cross the socket) until the core has nothing left to do."""
    steps = []
    for _ in range(max_steps):
        steps.append({c: loads(dumps(u)) for c, u in core.step_all(num_clients).items()})
        if not core.has_ready_work:
            return steps
    raise AssertionError("the core did not go idle")


def events_of(steps: list[dict[int, CoreUpdate]], client: int, stream_id: str) -> list[StreamEvent]:
    return [e for s in steps if client in s for e in s[client].stream_events if e.stream_id == stream_id]


def feed(core: EngineCore, stream_id: str, audio: np.ndarray, client: int = 0, piece: int = 3000) -> None:
    for start in range(0, len(audio), piece):
        core.handle(PushAudio(stream_id), audio[start : start + piece], client)


def test_stream_messages_and_updates_survive_the_socket():
    event = StreamEvent("s", 0, (3,), (1, 3), "ab", 0.0, 0.16, final=True, closed=True)
    messages = [OpenStream("s", StreamOptions(lookahead=1, language="de")), PushAudio("s"), CloseStream("s"),
                AbortStreams(("s", "t")), CoreUpdate(stream_events=(event,),
                                                     stream_failures=(StreamFailed("t", STREAM_CAPACITY, "full"),))]
    assert [loads(dumps(m)) for m in messages] == messages


def test_a_stream_through_the_core_gets_transformers_streamed_tokens_one_update_per_step(nemotron):
    loaded, audio, expected = nemotron
    core = make_core(loaded)
    core.handle(OpenStream("a", StreamOptions(lookahead=LOOKAHEAD)), None, client=1)
    core.handle(OpenStream("b", StreamOptions(lookahead=LOOKAHEAD)), None, client=0)
    feed(core, "a", audio[1], client=1)
    feed(core, "b", audio[2], client=0)
    core.handle(CloseStream("a"), None, client=1)
    core.handle(CloseStream("b"), None, client=0)
    steps = step_until_idle(core, num_clients=2)
    for client, stream_id, tokens in ((1, "a", expected[1]), (0, "b", expected[2])):
        events = events_of(steps, client, stream_id)
        assert [t for e in events for t in e.new_token_ids] == tokens and tokens
        assert events[-1].closed and events[-1].final and sum(e.closed for e in events) == 1
        assert events[-1].text == loaded.tokenizer.decode(tokens)
        assert all(e.end_s <= f.end_s for e, f in zip(events, events[1:]))
        other = 1 - client
        assert not events_of(steps, other, stream_id)  # only the owner hears its stream
    assert sum(1 for s in steps if s) > 2  # the events came over several steps, not in one update at the end
    assert core.engine.streams.num_streams == 0 and core.streams.owners == {}


def test_a_stream_fed_while_the_core_steps_equals_one_fed_at_once(nemotron):
    """Audio arriving between steps (as live audio does) decodes as the same tokens."""
    loaded, audio, expected = nemotron
    core = make_core(loaded)
    core.handle(OpenStream("live", StreamOptions(lookahead=LOOKAHEAD)), None)
    assert not core.has_ready_work  # an open stream without audio: the loop waits for messages, not spinning
    events = []
    for start in range(0, len(audio[1]), 1600):  # 100 ms at a time, a step after each
        core.handle(PushAudio("live"), audio[1][start : start + 1600])
        update = core.step()
        events += [] if update is None else update.stream_events
    core.handle(CloseStream("live"), None)
    events += [e for s in step_until_idle(core) for u in s.values() for e in u.stream_events]
    assert [t for e in events for t in e.new_token_ids] == expected[1]


def test_whole_files_run_beside_streams_in_the_same_core(nemotron):
    loaded, audio, expected = nemotron
    alone = ASREngine(loaded, SMALL_ENGINE)
    alone.add_request(audio[2], DecodeOptions(), request_id="file")
    offline = None
    while alone.has_unfinished():
        offline = next((o.token_ids for o in alone.step() if o.finished), offline)
    core = make_core(loaded)
    core.handle(AddRequest("file", DecodeOptions(), partial=False), audio[2])
    core.handle(OpenStream("live", StreamOptions(lookahead=LOOKAHEAD)), None)
    feed(core, "live", audio[1])
    core.handle(CloseStream("live"), None)
    steps = step_until_idle(core)
    finished = [d for s in steps for u in s.values() for d in u.deltas if d.finished]
    assert [list(d.new_token_ids) for d in finished] == [offline]
    assert [t for e in events_of(steps, 0, "live") for t in e.new_token_ids] == expected[1]


def test_a_full_core_refuses_a_stream_to_its_client_and_aborts_free_the_slot(nemotron):
    loaded, audio, _ = nemotron
    core = make_core(loaded, max_streams=1)
    core.handle(OpenStream("first", StreamOptions()), None, client=0)
    core.handle(OpenStream("second", StreamOptions()), None, client=1)
    core.handle(PushAudio("second"), audio[1][:1600], client=1)  # to a stream that never opened: dropped
    update = core.step_all(2)
    assert update[1].stream_failures == (StreamFailed("second", STREAM_CAPACITY, "all 1 stream slots are taken"),)
    assert not update[0].stream_failures
    assert update[0].stats.num_streams == 1 and update[0].stats.stream_slots == 1
    core.handle(AbortStreams(("first",)), None, client=0)
    core.handle(OpenStream("second", StreamOptions()), None, client=1)
    update = core.step_all(2)  # the stream count did not change: the stats go to no one
    assert 1 not in update and core.streams.owners == {"second": 1}


def test_a_client_that_goes_away_has_its_streams_aborted(nemotron):
    loaded, audio, _ = nemotron
    core = make_core(loaded, max_streams=2)
    core.handle(OpenStream("mine", StreamOptions()), None, client=0)
    core.handle(OpenStream("gone-1", StreamOptions()), None, client=1)
    feed(core, "gone-1", audio[1][:8000], client=1)
    core.step_all(2)
    core.drop_client(1)
    update = core.step_all(2)
    assert update[0].stats.num_streams == 1 and core.streams.owners == {"mine": 0}
    assert core.engine.streams.scheduler.num_free_slots == 1


def test_bad_audio_ends_the_stream_with_a_failure_and_a_model_that_cannot_stream_refuses(nemotron, tiny_en):
    loaded, _, _ = nemotron
    core = make_core(loaded)
    core.handle(OpenStream("s", StreamOptions()), None)
    core.handle(PushAudio("s"), np.array([0.0, np.nan], dtype=np.float32))
    failures = core.step().stream_failures
    assert [(f.stream_id, f.kind) for f in failures] == [("s", INVALID_REQUEST)] and "NaN" in failures[0].message
    assert core.engine.streams.num_streams == 0
    offline = EngineCore(Engine(tiny_en, SMALL_ENGINE))
    offline.handle(OpenStream("s", StreamOptions()), None)
    failures = offline.step().stream_failures
    assert [(f.stream_id, f.kind) for f in failures] == [("s", INVALID_REQUEST)]
    assert "cannot stream" in failures[0].message


def test_the_client_stream_yields_events_until_closed_and_raises_a_failure():
    sent = []

    async def scenario():
        forgotten = []
        stream = LiveStream("s", lambda m, a: sent.append(m), forgotten.append)
        stream.push(np.zeros(160, np.float32))
        stream.close()
        event = StreamEvent("s", 0, (1,), (1,), "a", 0.0, 0.1)
        for item in (event, StreamEvent("s", 0, (), (1,), "a", 0.0, 0.1, final=True, closed=True)):
            stream.queue.put_nowait(item)
        got = [e async for e in stream.events()]
        stream.push(np.zeros(160, np.float32))  # over: dropped
        full = LiveStream("t", lambda m, a: sent.append(m), forgotten.append)
        full.queue.put_nowait(stream_error(StreamFailed("t", STREAM_CAPACITY, "all 1 stream slots are taken")))
        with pytest.raises(StreamCapacityError, match="slots are taken"):
            async for _ in full.events():
                pass
        full.abort()  # over already: nothing sent
        return got, forgotten

    got, forgotten = asyncio.run(scenario())
    assert [e.closed for e in got] == [False, True] and forgotten == ["s", "t"]
    assert [type(m).__name__ for m in sent] == ["PushAudio", "CloseStream"]
