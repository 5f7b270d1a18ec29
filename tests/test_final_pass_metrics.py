"""What the two-pass final (``--final-model``) reports of itself: the finals it holds, how many it sent with the
final model's transcript and how many fell back to the online text, its engine's queue; and how /metrics shows
them (``oasr_final_model_*``, absent without a final model). FunASR's tiny offline Paraformer of
tests/data/funasr/ is the final model; tests/test_funasr_stream_two_pass_server.py reads the series off a server."""

from __future__ import annotations

import pytest

import oasr
from oasr.engine.final_pass import FinalPass
from oasr.engine.stats import EngineStats, FinalPassStats, ReplicaStats
from oasr.errors import OASRError
from oasr.hosting.ray_replicas import final_pass_sum
from oasr.streaming.types import StreamEvent
from serving_harness import metrics_of
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


def test_metrics_show_the_final_pass_only_where_there_is_one() -> None:
    m = metrics_of(EngineStats(0, 0, 0, 0, 1, final_pass=FinalPassStats(3, 5, 2, 4, 1)))
    assert {name: value for name, value in m.items() if name.startswith("oasr_final_model_")} == {
        "oasr_final_model_finals_waiting": 3, "oasr_final_model_finals_completed_total": 5,
        "oasr_final_model_fallbacks_total": 2, "oasr_final_model_requests_waiting": 4,
        "oasr_final_model_requests_running": 1}
    without = metrics_of(EngineStats(0, 0, 0, 0, 1))
    assert "oasr_engine_requests_waiting" in without
    assert not [name for name in without if name.startswith("oasr_final_model_")]


def test_replicas_final_passes_add_up_counting_only_the_live_ones_queues() -> None:
    def replica(replica_id: int, up: bool, final_pass: FinalPassStats | None) -> ReplicaStats:
        return ReplicaStats(replica_id, up, 0, 0, EngineStats(0, 0, 0, 0, 1, final_pass=final_pass))

    replicas = [replica(0, True, FinalPassStats(1, 10, 2, 3, 1)), replica(1, False, FinalPassStats(4, 5, 1, 6, 2)),
                replica(2, True, FinalPassStats(2, 1, 0, 0, 1))]
    assert final_pass_sum(replicas) == FinalPassStats(3, 16, 3, 3, 2)
    assert final_pass_sum([replica(0, True, None), replica(1, True, None)]) is None
