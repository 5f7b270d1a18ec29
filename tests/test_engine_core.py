"""The engine core's loop logic without its process (messages in, updates out), the client's token
bookkeeping, and the batch-size counts: all in this process, on the real tiny.en."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import oasr
from oasr.audio import load_audio
from oasr.engine.batch_stats import BatchSizeCounter
from oasr.hosting.client import _Request
from oasr.hosting.core import EngineCore
from oasr.hosting.protocol import (
    INTERNAL_ERROR,
    INVALID_REQUEST,
    UNSUPPORTED_OPTION,
    AbortRequests,
    AddRequest,
    AlignWords,
    CheckOptions,
    CheckResult,
    CoreUpdate,
    StopCore,
    TokenDelta,
    dumps,
    loads,
)
from oasr.engine.combined import Engine
from oasr.engine.request import FinishReason
from oasr.transcription.results import decoded_window
from oasr.transcription.words import alignment_rows
from oasr.models.whisper.alignment import AlignmentRow, TextSpan
from oasr.types import DecodeOptions
from serving_harness import SMALL_ENGINE

JFK = Path(oasr.__file__).parent / "assets" / "jfk.flac"


@pytest.fixture
def core(tiny_en) -> EngineCore:
    # One torch thread, as the server's test cores run: two threads on a shared 2-core machine wait on each other.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield EngineCore(Engine(tiny_en, SMALL_ENGINE))
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def jfk() -> np.ndarray:
    return load_audio(JFK)


def run_until_idle(core: EngineCore, max_steps: int = 500) -> list[CoreUpdate]:
    updates = []
    for _ in range(max_steps):
        update = core.step()
        if update is not None:
            updates.append(loads(dumps(update)))  # what crosses the socket
        if not core.engine.has_unfinished():
            return updates
    raise AssertionError("the engine did not finish")


def deltas_of(updates: list[CoreUpdate], request_id: str) -> list[TokenDelta]:
    return [d for u in updates for d in u.deltas if d.request_id == request_id]


def test_streamed_request_gets_every_new_token_and_the_other_only_its_result(core, tiny_en, jfk):
    expected = oasr.transcribe(JFK, model=tiny_en)[0]
    assert core.handle(AddRequest("streamed", DecodeOptions(), partial=True), jfk)
    assert core.handle(AddRequest("final-only", DecodeOptions(), partial=False), jfk)
    updates = run_until_idle(core)
    streamed, final_only = deltas_of(updates, "streamed"), deltas_of(updates, "final-only")
    assert len(final_only) == 1 and final_only[0].finished
    assert list(final_only[0].new_token_ids) == expected.token_ids
    assert final_only[0].finish_reason is FinishReason.END_OF_TEXT and final_only[0].timings.finished is not None
    *partials, last = streamed
    assert len(partials) > 1 and not any(d.finished or d.timings for d in partials)
    assert all(d.new_token_ids for d in partials), "a delta without new tokens is traffic for nothing"
    assert [t for d in partials for t in d.new_token_ids] == expected.token_ids[: sum(len(d.new_token_ids)
                                                                                      for d in partials)]
    assert last.finished and list(last.new_token_ids) == expected.token_ids
    stats = [u.stats for u in updates if u.stats is not None][-1]
    assert (stats.num_running, stats.num_waiting, stats.kv_blocks_used) == (0, 0, 0)
    assert stats.encode_batch_sizes.num_rows == 2  # each request encoded once
    assert stats.decode_batch_sizes.num_steps == len(partials)  # one streamed delta per decode tick


def test_client_stream_rebuilds_the_token_list_from_deltas():
    stream = _Request(loop=None, queue=None)  # type: ignore[arg-type]
    outputs = [stream.apply(TokenDelta("r", (1, 2), "en", False, None, None)),
               stream.apply(TokenDelta("r", (3,), "en", False, None, None)),
               stream.apply(TokenDelta("r", (1, 2, 3, 4), "en", True, FinishReason.LENGTH, None))]
    assert [o.token_ids for o in outputs] == [[1, 2], [1, 2, 3], [1, 2, 3, 4]]
    assert [o.finished for o in outputs] == [False, False, True]
    # A finished delta is the whole truth: it replaces what partial deltas said.
    assert stream.apply(TokenDelta("r", (9,), "en", True, FinishReason.END_OF_TEXT, None)).token_ids == [9]


def test_abort_frees_rows_and_stops_the_deltas(core, jfk):
    core.handle(AddRequest("a", DecodeOptions(min_new_tokens=200), partial=True), jfk)
    first = core.step()
    assert first is not None and deltas_of([first], "a")
    assert first.stats.num_running == 1 and first.stats.kv_blocks_used > 0
    core.handle(AbortRequests(("a", "never-added")))
    updates = run_until_idle(core)
    assert not deltas_of(updates, "a")
    stats = updates[-1].stats if updates else core.engine.stats()
    assert (stats.num_running, stats.kv_blocks_used) == (0, 0)


def test_requests_the_engine_refuses_fail_alone_with_their_kind(core, jfk):
    core.handle(AddRequest("german", DecodeOptions(language="de"), partial=False), jfk)
    core.handle(AddRequest("too-long", DecodeOptions(), partial=False), np.zeros(31 * 16_000, np.float32))
    core.handle(AddRequest("fine", DecodeOptions(), partial=False), jfk)
    core.handle(CheckOptions(7, DecodeOptions(language="de")))
    core.handle(CheckOptions(8, DecodeOptions(language="en")))
    updates = run_until_idle(core)
    failures = {f.request_id: f for u in updates for f in u.failures}
    assert set(failures) == {"german", "too-long"}
    assert failures["german"].kind == UNSUPPORTED_OPTION and "English-only" in failures["german"].message
    assert failures["too-long"].kind == INVALID_REQUEST and "exceeds the model's window" in failures["too-long"].message
    checks = [c for u in updates for c in u.checks]
    assert checks[1] == CheckResult(8, None) and checks[0].call_id == 7 and "English-only" in checks[0].error
    assert deltas_of(updates, "fine")[-1].finished


def test_stop_message_ends_the_loop(core):
    assert core.handle(StopCore()) is False
    with pytest.raises(TypeError):
        core.handle("not a message")


def test_batch_size_counts_are_cumulative_per_bound():
    counter = BatchSizeCounter((1, 2, 4, 8))
    for size in (0, 1, 1, 3, 4, 5, 9, 0):
        counter.observe(size)
    counts = counter.snapshot()
    assert counts.bounds == (1, 2, 4, 8)
    assert counts.cumulative == (2, 2, 4, 5)  # 9 rows fall only in +Inf
    assert (counts.num_steps, counts.num_rows) == (6, 23)  # steps of size 0 are not steps of this walk


def test_two_clients_hear_only_their_own_requests_and_either_can_abort(core, jfk):
    # Client 1 adds a long request and a bad one, client 0 a normal one; both ask an option check.
    core.handle(AddRequest("w1-long", DecodeOptions(min_new_tokens=200), partial=True), jfk, client=1)
    core.handle(AddRequest("w1-bad", DecodeOptions(), partial=False), np.zeros(31 * 16_000, np.float32), client=1)
    core.handle(AddRequest("w0-fine", DecodeOptions(), partial=False), jfk, client=0)
    core.handle(CheckOptions(3, DecodeOptions(language="de")), client=0)
    core.handle(CheckOptions(3, DecodeOptions(language="en")), client=1)
    first = core.step_all(2)
    assert [f.request_id for f in first[1].failures] == ["w1-bad"] and not first.get(0, CoreUpdate()).failures
    assert [c.error is None for c in first[0].checks] == [False] and [c.error for c in first[1].checks] == [None]
    assert first[0].stats == first[1].stats is not None  # changed stats reach every client
    heard: dict[int, set[str]] = {0: set(), 1: set()}
    finished = set()
    for update in first.items():
        heard[update[0]] |= {d.request_id for d in update[1].deltas}
    for _ in range(500):
        updates = core.step_all(2)
        for client, update in updates.items():
            heard[client] |= {d.request_id for d in update.deltas}
            finished |= {d.request_id for d in update.deltas if d.finished}
        if "w0-fine" in finished and "w1-long" in heard[1]:
            break
    assert heard == {0: {"w0-fine"}, 1: {"w1-long"}}
    assert "w1-long" not in finished  # 200 tokens at least: still decoding
    core.handle(AbortRequests(("w1-long",)), client=1)
    updates = core.step_all(2)
    assert not any(d.request_id == "w1-long" for u in updates.values() for d in u.deltas)
    assert not core.engine.has_unfinished() and core.engine.stats().kv_blocks_used == 0


def test_word_alignment_answers_its_client_with_offline_words_and_a_bad_one_fails_alone(core, tiny_en, jfk):
    expected = oasr.transcribe(JFK, model=tiny_en, word_timestamps=True)[0]
    window = decoded_window(tiny_en.tokenizer, 0, len(jfk), expected.duration_s, expected.token_ids, "en")
    rows = tuple(alignment_rows([window], [jfk], "transcribe", core.engine.window_samples))
    core.handle(AlignWords(5, rows, (len(jfk),)), jfk, client=1)
    # Spans that do not add up to the row's text: the alignment raises, the core answers and goes on.
    bad = AlignmentRow(rows[0].token_ids, rows[0].num_frames, spans=(TextSpan(0.0, 1.0, 1),))
    core.handle(AlignWords(6, (bad,), (len(jfk),)), jfk, client=1)
    updates = core.step_all(2)
    assert updates.get(0, CoreUpdate()).alignments == ()  # client 0 asked nothing
    good, failed = (loads(dumps(a)) for a in updates[1].alignments)  # what crosses the socket
    assert good.call_id == 5 and good.error_kind is None
    assert list(good.words[0]) == [w for s in expected.segments for w in s.words]
    assert (failed.call_id, failed.error_kind, failed.words) == (6, INTERNAL_ERROR, ())
    core.handle(AddRequest("after", DecodeOptions(), partial=False), jfk)
    assert deltas_of(run_until_idle(core), "after")[-1].finished


def test_the_loop_writes_a_profile_of_its_steps_when_asked_and_nothing_otherwise(core, jfk, tmp_path, monkeypatch):
    """``OASR_CORE_PROFILE``: the loop's cProfile statistics go to PATH.<pid> when it ends; they hold the engine's
    step. Unset, the loop writes nothing."""
    import os
    import pstats

    from oasr.hosting.loop import PROFILE_ENV, Envelope, QueueInbox, run_core

    def run(request_id: str) -> list[CoreUpdate]:
        inbox, delivered = QueueInbox(), []
        inbox.put(Envelope(0, AddRequest(request_id, DecodeOptions(), partial=False), jfk))
        run_core(core, inbox, lambda client, update: delivered.append(update), 1,
                 keep_going=lambda: not any(d.finished for u in delivered for d in u.deltas))
        return delivered

    path = tmp_path / "core.prof"
    monkeypatch.delenv(PROFILE_ENV, raising=False)
    run("plain")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setenv(PROFILE_ENV, str(path))
    delivered = run("profiled")
    assert any(d.request_id == "profiled" and d.finished for u in delivered for d in u.deltas)
    stats = pstats.Stats(str(tmp_path / f"core.prof.{os.getpid()}"))
    assert any(name == "step_all" for (_, _, name) in stats.stats)
