"""FSMN-VAD as the realtime sessions' server VAD (``oasr serve --vad fsmn:DIR``): its live stream gives FunASR's
streaming events, and a session turns at them (``speech_started`` at a segment's start, ``speech_stopped`` and the
commit at its end). The golden (tests/data/funasr/fsmn_vad_realtime.json, scripts/funasr_oracle/
build_fsmn_realtime.py) is FunASR's ``generate(input=piece, cache=..., chunk_size=200)`` on one 38 s stream of
shared clips, as the server hears it (24 kHz PCM16 resampled to 16 kHz), in 200 ms pieces, never final."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from oasr.serving.realtime.session import TurnBuffer, TurnDetection
from oasr.serving.settings import RealtimeSettings, ServerSettings
from oasr.vad import load_detector
from oasr.vad.stream import SpeechEdge, StreamSegments
from test_realtime import as_served, pcm16_24k
from test_realtime_session import FakeServing, FakeSocket, ga_update, item_ids, until
from tests.speech_data import clips

DATA = Path(__file__).parent / "data" / "funasr"
FSMN = f"fsmn:{DATA / 'fsmn_vad'}"
SAMPLES_PER_MS = 16
STARTED, STOPPED = "input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped"


@pytest.fixture(scope="module")
def golden() -> dict:
    return json.loads((DATA / "fsmn_vad_realtime.json").read_text())


@pytest.fixture(scope="module")
def pcm(golden) -> bytes:
    """The golden's stream as a client sends it (24 kHz PCM16)."""
    parts = {clip.id: clip.audio for clip in clips({clip_id for clip_id, _ in golden["stream"]})}
    audio = np.concatenate([parts[clip_id] if seconds is None else parts[clip_id][: int(seconds * 16_000)]
                            for clip_id, seconds in golden["stream"]])
    return pcm16_24k(audio)


@pytest.fixture(scope="module")
def heard(golden, pcm) -> np.ndarray:
    """What the server hears of it, checked to be the samples FunASR was given."""
    audio = as_served(pcm).astype(np.float32)
    assert len(audio) == golden["num_samples"]
    assert abs(float(np.abs(audio).astype(np.float64).sum()) - golden["sum_abs"]) < 1e-2
    return audio


def golden_edges(golden: dict) -> list[list[SpeechEdge]]:
    """FunASR's events of each piece (``[start, -1]``, ``[-1, end]``, ``[start, end]``) as speech edges."""
    return [[SpeechEdge(starts, ms * SAMPLES_PER_MS) for start, end in events
             for starts, ms in ((True, start), (False, end)) if ms >= 0] for events in golden["events"]]


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """The stream's steps are tiny: split over torch's intra-op threads on a loaded 2-core machine, they wait on
    each other some 20 times longer than they compute."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def stream_pushes(audio: np.ndarray, sizes: list[int]) -> list[tuple[int, StreamSegments]]:
    """A fresh stream fed ``audio`` in appends of ``sizes``: (samples pushed, what it said) per append."""
    stream = load_detector(FSMN).open_stream()
    bounds = np.cumsum([0, *sizes])
    return [(int(end), stream.push(audio[start:end])) for start, end in zip(bounds, bounds[1:])]


def test_the_stream_gives_funasrs_events_as_its_pieces_complete(golden, heard) -> None:
    """Appends of any size: each of FunASR's events comes with the append that completes its 200 ms piece.
    ``settled`` never passes the next start, and with speech open ``speech_until`` never passes the end it gets
    (nor comes before the start)."""
    step = golden["chunk_ms"] * SAMPLES_PER_MS
    expected = [(edge, (piece + 1) * step) for piece, edges in enumerate(golden_edges(golden)) for edge in edges]
    sizes = np.random.default_rng(38).integers(1, 9000, size=len(heard)).tolist()
    sizes = sizes[: int(np.searchsorted(np.cumsum(sizes), len(heard))) + 1]
    edges, settled, open_until = [], [], []  # (edge, samples pushed); (edges so far, settled / speech_until)
    for position, found in stream_pushes(heard, sizes):
        assert isinstance(found, StreamSegments)
        edges += [(edge, position) for edge in found.edges]
        settled.append((len(edges), found.settled))
        if len(edges) % 2:  # speech open
            open_until.append((len(edges), found.speech_until))
    assert [edge for edge, _ in edges] == [edge for edge, _ in expected]
    for (_, pushed), (_, completed) in zip(edges, expected, strict=True):
        assert completed <= pushed < completed + 9000
    # Four segments; the third ended by the schedule's second entry (over 10 s of speech: 1 s of silence ends it).
    assert len(edges) == 8
    for num_edges, sample in settled:
        if num_edges < len(edges) and num_edges % 2 == 0:  # no speech open: the next start comes at or after it
            assert sample <= edges[num_edges][0].sample
    for num_edges, sample in open_until:
        if num_edges < len(edges):
            assert edges[num_edges - 1][0].sample <= sample <= edges[num_edges][0].sample
    assert [s for _, s in settled] == sorted(s for _, s in settled)


def test_a_turn_buffer_cuts_turns_at_the_segment_edges() -> None:
    """Edges are counted from where the buffer's VAD started (its end when turn detection was set)."""
    buffer = TurnBuffer(16_000 * 60, new_item_id=item_ids())
    buffer.append(np.zeros(1000, dtype=np.float32))
    buffer.set_turn_detection(TurnDetection())
    buffer.append(np.arange(1000, 9000, dtype=np.float32))
    events = buffer.detect(StreamSegments((SpeechEdge(True, 2000),), settled=2000, speech_until=5000))
    assert [type(e).__name__ for e in events] == ["SpeechStarted"] and events[0].audio_start_ms == 3000 // 16
    assert buffer.settled_end == 6000
    events = buffer.detect(StreamSegments((SpeechEdge(False, 6000),), settled=6000, speech_until=6000))
    stopped, committed = events
    assert stopped.audio_end_ms == 7000 // 16 and committed.item_id == stopped.item_id == "item_1"
    assert np.array_equal(committed.audio, np.arange(3000, 7000, dtype=np.float32))
    assert buffer.num_buffered_samples == 2000  # what follows the turn, until the detector settles it
    buffer.detect(StreamSegments((), settled=7500, speech_until=7500))
    assert buffer.num_buffered_samples == 500


def session_events(pcm: bytes, num_turns: int) -> tuple[list[dict], list[int]]:
    """A session on a fake engine with ``--vad fsmn:DIR``, the stream appended 100 ms at a time: what it sent
    once ``num_turns`` turns were completed, and each transcribed turn's length in samples."""
    serving = FakeServing("ok")
    serving.settings = ServerSettings(served_model_name="fake", realtime=RealtimeSettings(vad=FSMN))
    lengths = []
    transcribe = serving.transcribe_turn

    async def recorded(audio, *args, **kwargs):
        lengths.append(len(audio))
        return await transcribe(audio, *args, **kwargs)

    serving.transcribe_turn = recorded
    events = [ga_update({"turn_detection": {"type": "server_vad"}})]
    events += [{"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm[i : i + 4800]).decode()}
               for i in range(0, len(pcm), 4800)]

    async def run():
        from oasr.serving.realtime.connection import RealtimeConnection, RealtimeService

        hold = asyncio.Event()
        socket = FakeSocket(events, hold)
        task = asyncio.create_task(RealtimeConnection(socket, RealtimeService(serving), "ga", None).run())
        await until(lambda: sum(e["type"].endswith("completed") for e in socket.sent) >= num_turns, task, 60)
        hold.set()
        await task
        return socket.sent

    return asyncio.run(run()), lengths


def test_a_realtime_session_turns_at_funasrs_segments(golden, pcm, heard) -> None:
    sent, lengths = session_events(pcm, 4)
    assert not [e for e in sent if e["type"] == "error"]
    segments = [[edge.sample // SAMPLES_PER_MS for edge in piece] for piece in golden_edges(golden) if piece]
    segments = [[a, b] for (a,), (b,) in zip(segments[::2], segments[1::2], strict=True)]
    started = [e for e in sent if e["type"] == STARTED]
    stopped = [e for e in sent if e["type"] == STOPPED]
    assert [[a["audio_start_ms"], b["audio_end_ms"]] for a, b in zip(started, stopped, strict=True)] == segments
    for begun, ended in zip(started, stopped, strict=True):  # stopped, committed, then transcribed: one item
        mine = [e["type"] for e in sent if e.get("item_id") == begun["item_id"]]
        assert mine[:3] == [STARTED, STOPPED, "input_audio_buffer.committed"] and ended["item_id"] == begun["item_id"]
    assert lengths == [(end - start) * SAMPLES_PER_MS for start, end in segments]


def test_serve_takes_a_vad_that_streams_and_refuses_one_that_cannot_at_startup(monkeypatch, capsys, tmp_path) -> None:
    import oasr.serving.app
    from oasr.cli import main

    served = []
    monkeypatch.setattr(oasr.serving.app, "serve", lambda model, settings, **kwargs: served.append(settings))
    assert main(["serve", "--device", "cpu", "--vad", FSMN]) == 0
    assert main(["serve", "--device", "cpu"]) == 0
    assert [s.realtime.vad for s in served] == [FSMN, "silero"]
    for spec, message in [("energy", "the energy VAD cannot score a live stream"),
                          ("fsmn", "the fsmn VAD needs its model folder: fsmn:FOLDER"),
                          (f"fsmn:{tmp_path / 'absent'}", "does not exist")]:
        assert main(["serve", "--device", "cpu", "--vad", spec]) == 2
        err = capsys.readouterr().err
        assert err.startswith("oasr: error: ") and message in err and "Traceback" not in err
    assert len(served) == 2


def test_which_detectors_stream_and_what_their_streams_give(heard) -> None:
    """The seam's capability: silero and fsmn open streams (probabilities, and segment edges), energy does not;
    Silero's stream fed appends of any size gives its one-pass probabilities of the whole chunks."""
    from oasr.vad.stream import StreamingDetector

    pytest.importorskip("silero_vad")
    detectors = {spec: load_detector(spec) for spec in ("silero", "energy", FSMN)}
    assert {spec: isinstance(d, StreamingDetector) for spec, d in detectors.items()} == {
        "silero": True, "energy": False, FSMN: True}
    assert [detectors[spec].cuts_own_segments for spec in ("silero", FSMN)] == [False, True]
    silero = detectors["silero"]
    audio = heard[: 8 * 16_000]
    sizes = np.random.default_rng(5).integers(1, 3000, size=len(audio)).tolist()
    bounds = np.cumsum([0, *sizes[: int(np.searchsorted(np.cumsum(sizes), len(audio))) + 1]])
    stream = silero.open_stream()
    probs = np.concatenate([stream.push(audio[a:b]) for a, b in zip(bounds, bounds[1:])])
    whole = silero.speech_probs([audio])[0]
    assert len(probs) == len(audio) // silero.chunk_samples
    np.testing.assert_allclose(probs, whole[: len(probs)], atol=1e-5)
    assert probs.max() > 0.5 > probs.min()
