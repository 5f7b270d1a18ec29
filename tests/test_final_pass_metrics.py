"""What the two-pass final (``--final-model``) reports of itself: the finals it holds, how many it sent with the
final model's transcript and how many fell back to the online text, its engine's queue. FunASR's tiny offline
Paraformer of tests/data/funasr/ is the final model."""

from __future__ import annotations

import pytest

import oasr
from oasr.engine.final_pass import FinalPass
from oasr.engine.stats import FinalPassStats
from oasr.errors import OASRError
from oasr.streaming.types import StreamEvent
from test_funasr_stream_two_pass import OFFLINE, clips

SAMPLE_RATE = 16_000


@pytest.fixture(scope="module")
def offline():
    return oasr.from_pretrained(OFFLINE, device="cpu", dtype="float32")


def online_final(utterance: int, *, closed: bool) -> StreamEvent:
    """An utterance's final as the streaming model gives it (one new token, its own text)."""
    return StreamEvent("s", utterance, (7,), (6, 7), f"online {utterance}", 0.0, 1.0, final=True, closed=closed)


def two_utterances(final: FinalPass, first_samples: int) -> None:
    """A stream whose clip ends its first utterance after ``first_samples`` and its second at the stream's end."""
    final.check("s", None)
    final.open("s", None)
    final.push("s", clips()[0])  # 2.99 s
    final.end_utterance(online_final(0, closed=False), first_samples)
    final.end_utterance(online_final(1, closed=True), 0)


def run_out(final: FinalPass) -> list[StreamEvent]:
    events = []
    while final.has_unfinished():
        events += final.step()
    return events


def test_finals_transcribed_by_the_final_model_are_held_then_counted_completed(offline) -> None:
    final = FinalPass(offline)
    assert final.stats() == FinalPassStats(0, 0, 0, 0, 0)
    two_utterances(final, SAMPLE_RATE)
    held = final.stats()
    assert (held.num_waiting, held.num_completed, held.num_fallbacks) == (2, 0, 0)
    assert held.num_requests_waiting + held.num_requests_running == 2  # one window per utterance
    events = run_out(final)
    assert [(e.utterance, e.final_model) for e in events] == [(0, offline.name), (1, offline.name)]
    assert final.stats() == FinalPassStats(0, 2, 0, 0, 0)


def test_an_utterance_the_final_model_refuses_is_counted_as_a_fallback(offline, monkeypatch) -> None:
    final = FinalPass(offline)
    admit = final.engine.add_request

    def refuse_long(audio, *args, **kwargs):  # as a model whose window is shorter than the second utterance
        if len(audio) > SAMPLE_RATE:
            raise OASRError(f"audio of {len(audio)} samples exceeds the model's window ({SAMPLE_RATE})")
        return admit(audio, *args, **kwargs)

    monkeypatch.setattr(final.engine, "add_request", refuse_long)
    two_utterances(final, SAMPLE_RATE // 2)  # 0.5 s, then 2.49 s
    held = final.stats()
    assert (held.num_waiting, held.num_completed, held.num_fallbacks) == (2, 0, 0)
    assert held.num_requests_waiting + held.num_requests_running == 1  # the refused one queued nothing
    events = run_out(final)
    assert [(e.utterance, e.final_model) for e in events] == [(0, offline.name), (1, None)]
    assert events[1].text == "online 1"  # the streaming model's own text stands
    assert final.stats() == FinalPassStats(0, 1, 1, 0, 0)
