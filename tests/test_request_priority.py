"""A request's priority from where it is made to the scheduler: a realtime turn's windows are sent at
``INTERACTIVE_PRIORITY`` and an upload's at the default, the client carries the priority to the core (the
in-process host, on the real tiny.en), and ``AddRequest`` keeps it across the engine-core process's encoding."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import torch

import oasr
from oasr.audio import load_audio
from oasr.engine.combined import Engine
from oasr.engine.request import BULK_PRIORITY, INTERACTIVE_PRIORITY
from oasr.hosting.core import EngineCore
from oasr.hosting.inproc import InprocClient
from oasr.hosting.protocol import AddRequest, dumps, loads
from oasr.serving.admission import Ticket
from oasr.serving.serving import OpenAIServingTranscription
from oasr.serving.settings import ServerSettings
from oasr.types import DecodeOptions
from serving_harness import SMALL_ENGINE, RecordingEngine

JFK = Path(oasr.__file__).parent / "assets" / "jfk.flac"


@pytest.fixture(scope="module")
def client(tiny_en):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the test machine's cores are shared: one thread, as the server's test cores run
    client = InprocClient(EngineCore(Engine(tiny_en, SMALL_ENGINE)))
    yield client
    client.shutdown()
    torch.set_num_threads(threads)


@pytest.fixture
def queued(client, monkeypatch) -> list[tuple[str, int]]:
    """(request id, priority) of every request the core's scheduler is handed, in order."""
    scheduler = client.core.engine.offline.scheduler
    add = scheduler.add
    seen: list[tuple[str, int]] = []

    def recorded(request) -> None:
        seen.append((request.request_id, request.priority))
        add(request)

    monkeypatch.setattr(scheduler, "add", recorded)
    return seen


def test_add_request_keeps_its_priority_across_the_process_encoding() -> None:
    turn = loads(dumps(AddRequest("turn", DecodeOptions(), False, INTERACTIVE_PRIORITY)))
    assert turn.priority == INTERACTIVE_PRIORITY
    assert loads(dumps(AddRequest("file", DecodeOptions(), False))).priority == BULK_PRIORITY


def test_a_priority_given_to_the_client_reaches_the_scheduler(client, queued) -> None:
    audio = load_audio(JFK)[: 3 * 16_000]

    async def decode(priority: int | None) -> None:
        extra = {} if priority is None else {"priority": priority}
        async for _ in client.generate(audio, DecodeOptions(max_new_tokens=4), partial=False, **extra):
            pass

    asyncio.run(decode(INTERACTIVE_PRIORITY))
    asyncio.run(decode(None))
    assert [priority for _, priority in queued] == [INTERACTIVE_PRIORITY, BULK_PRIORITY]


def test_a_realtime_turn_is_decoded_at_interactive_priority_and_an_upload_at_bulk(client, queued) -> None:
    engine = RecordingEngine(client)
    serving = OpenAIServingTranscription(engine, ServerSettings(served_model_name="tiny.en", request_timeout_s=300))
    audio = load_audio(JFK)
    pieces: list[str] = []

    async def on_text(piece: str) -> None:
        pieces.append(piece)

    async def both():
        turn = await serving.transcribe_turn(audio, DecodeOptions(), Ticket(lambda: None), on_text)
        num_turn_windows = len(engine.priorities)
        upload = await serving.transcribe_samples(audio, DecodeOptions(), Ticket(lambda: None))
        return turn, num_turn_windows, upload

    turn, num_turn_windows, upload = asyncio.run(both())
    assert turn.text == upload.transcription.text and "".join(pieces) == turn.text and "country" in turn.text
    assert engine.priorities[:num_turn_windows] == [INTERACTIVE_PRIORITY] * num_turn_windows
    assert engine.priorities[num_turn_windows:] == [BULK_PRIORITY] * (len(engine.priorities) - num_turn_windows)
    assert num_turn_windows >= 1 and len(engine.priorities) > num_turn_windows
    # and the core's scheduler saw the same, request by request
    assert [priority for _, priority in queued] == engine.priorities
