"""Hotwords in a realtime session: the update's ``hotwords`` reach each committed turn as a beam search with
them, a bad list or a model that cannot take them is refused naming the field."""

from __future__ import annotations

import asyncio

import pytest

from oasr.errors import UnsupportedOptionError
from oasr.models import ARCHITECTURES
from oasr.models.capabilities import capabilities_of, check_options
from oasr.types import Hotword
from test_realtime_session import FakeServing, FakeSocket, connection, ga_update, manual_turn_events, until


class RecordingServing(FakeServing):
    """FakeServing that keeps each turn's options; ``refuse_hotwords``: the engine serves no hotwords."""

    def __init__(self, refuse_hotwords: bool = False, capabilities=None) -> None:
        super().__init__("ok")
        self.options = []
        record = capabilities

        class Engine:
            capabilities = record

            async def check(self, options) -> None:
                if refuse_hotwords and options.hotwords:
                    raise UnsupportedOptionError("fake does not serve the option hotwords")

        self.engine = Engine()

    async def transcribe_turn(self, audio, options, hold, on_text, *, words=False):
        self.options.append(options)
        return await super().transcribe_turn(audio, options, hold, on_text, words=words)


def session(serving: FakeServing, events: list[dict], done) -> list[dict]:
    hold = asyncio.Event()

    async def run():
        socket = FakeSocket(events, hold)
        task = asyncio.create_task(connection(socket, serving).run())
        await until(lambda: done(socket.sent), task)
        hold.set()
        await task
        return socket.sent

    return asyncio.run(run())


def test_a_sessions_hotwords_reach_its_turns_as_a_beam_search() -> None:
    serving = RecordingServing()
    events = [ga_update({"transcription": {"hotwords": "new york:3, kennedy"}}), *manual_turn_events()]
    session(serving, events, lambda sent: any(e["type"].endswith("completed") for e in sent))
    (options,) = serving.options
    assert options.hotwords == (Hotword("new york", 3.0), Hotword("kennedy")) and options.beam_size == 4


def test_a_model_whose_network_takes_hotwords_decodes_them_without_a_beam() -> None:
    """SeACo-Paraformer's record says its hotwords need no beam (its strategy serves none wider than 1): a
    session's turns carry them alone, where a beam of 4 would be refused."""
    seaco = capabilities_of(ARCHITECTURES.get("seaco_paraformer"))
    serving = RecordingServing(capabilities=seaco)
    events = [ga_update({"transcription": {"hotwords": "kennedy"}}), *manual_turn_events()]
    session(serving, events, lambda sent: any(e["type"].endswith("completed") for e in sent))
    (options,) = serving.options
    assert options.hotwords == (Hotword("kennedy"),) and options.beam_size is None
    check_options(seaco, options, "seaco")


@pytest.mark.parametrize("hotwords, refuse, code", [("x:zz", False, "invalid_value"),
                                                    ("@/etc/passwd", False, "invalid_value"),
                                                    ("kennedy", True, "unsupported_option")])
def test_hotwords_a_session_cannot_use_are_refused_naming_the_field(hotwords, refuse, code) -> None:
    serving = RecordingServing(refuse_hotwords=refuse)
    events = [ga_update({"transcription": {"hotwords": hotwords}})]
    sent = session(serving, events, lambda sent: any(e["type"] == "error" for e in sent))
    error = next(e for e in sent if e["type"] == "error")["error"]
    assert (error["param"], error["code"]) == ("session.audio.input.transcription.hotwords", code), error
