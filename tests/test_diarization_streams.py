"""Live diarization against transformers' streaming mode on the tiny random checkpoint: every chunk's speaker
probabilities within 1e-4 of transformers' chunk, at each latency mode, for streams that share steps and
streams that do not; the finished segments equal ``extract_speaker_dict`` on the stream's chunks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nemotron3_diarization_reference import build_reference, mixture, processor, save_reference, streaming_logits
from oasr.diarization.loader import load_diarizer
from oasr.diarization.stream_plan import plan_chunk
from oasr.diarization.streams import DiarizationStreams
from oasr.errors import OASRError
from oasr.streaming.types import StreamCapacityError

MODES = ("low_latency", "very_low_latency", "ultra_low_latency")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    two, three = mixture(2), mixture(3)
    reference = build_reference([two, three])
    loaded = load_diarizer(save_reference(reference, tmp_path_factory.mktemp("diarization")), device="cpu")
    return reference, loaded, {"two": two, "three": three[: 16_000 * 6]}


def run_streams(streams: DiarizationStreams, audio: dict[str, np.ndarray], mode: str, piece: int,
                delay_pieces: dict[str, int]) -> dict[str, list]:
    """Pushes every input in pieces of ``piece`` samples (input k starts ``delay_pieces[k]`` pieces late),
    stepping after each round, then closes them -> each stream's events."""
    ids = {name: streams.open(mode, stream_id=name) for name in audio}
    events: dict[str, list] = {name: [] for name in audio}
    offsets = {name: -delay_pieces.get(name, 0) * piece for name in audio}
    closed: set[str] = set()
    while any(offsets[n] < len(audio[n]) for n in audio):
        for name, samples in audio.items():
            at = offsets[name]
            if 0 <= at < len(samples) or (at < 0 < at + piece):
                streams.push(ids[name], samples[max(at, 0) : at + piece])
            offsets[name] = at + piece
            if offsets[name] >= len(samples) and name not in closed:
                streams.close(ids[name])
                closed.add(name)
        for event in streams.step():
            events[event.stream_id].append(event)
    while streams.has_unfinished():
        for event in streams.step():
            events[event.stream_id].append(event)
    return events


@pytest.mark.parametrize("mode", MODES)
def test_stream_chunks_match_transformers_streaming_mode(setup, mode):
    reference, loaded, audio = setup
    streams = DiarizationStreams(loaded, max_streams=4)
    # the two streams start together, so their chunks share forwards until their caches part ways
    events = run_streams(streams, audio, mode, piece=2_000, delay_pieces={"three": 3})
    for name, samples in audio.items():
        expected = streaming_logits(reference, samples, mode)
        got = [e.probs for e in events[name] if len(e.probs)]
        assert len(got) == len(expected), name
        for i, (chunk, want) in enumerate(zip(got, expected)):
            want = want[0].sigmoid().numpy()
            assert chunk.shape == want.shape, (name, i)
            assert np.abs(chunk - want).max() < 1e-4, (name, i)
        assert events[name][-1].closed and sum(e.closed for e in events[name]) == 1
        segments = [{"Start": s.start, "End": s.end, "Speaker": s.speaker} for e in events[name] for s in e.segments]
        segments.sort(key=lambda s: (s["Start"], s["Speaker"]))
        want = processor(16).extract_speaker_dict(torch.cat(expected, dim=1), threshold=0.5)[0]
        assert segments == want and len(want) > 10


def test_streams_in_one_forward_equal_streams_alone(setup):
    _, loaded, audio = setup
    together = run_streams(DiarizationStreams(loaded), {"a": audio["two"], "b": audio["two"]}, "very_low_latency",
                           piece=3_000, delay_pieces={})
    alone = run_streams(DiarizationStreams(loaded), {"a": audio["two"]}, "very_low_latency", piece=3_000,
                        delay_pieces={})
    for x, y, z in zip(together["a"], together["b"], alone["a"], strict=True):
        assert np.array_equal(x.probs, y.probs) and np.abs(x.probs - z.probs).max() < 1e-5


def test_chunks_wait_for_their_lookahead_until_the_stream_closes(setup):
    _, loaded, _ = setup
    mode = DiarizationStreams(loaded).modes["ultra_low_latency"]  # 3 frames + 1 of look-ahead, 80 ms each
    assert plan_chunk(mode, 0, mode.first_samples, closed=False) is None
    first = plan_chunk(mode, 0, mode.first_samples + 1, closed=False)
    assert (first.first_frame, first.num_frames, first.lookahead, first.last) == (0, 32, 1, False)
    last = plan_chunk(mode, 1, mode.samples_end(1), closed=True)
    assert last.last and last.lookahead == 0 and last.first_frame == 24
    assert last.num_frames == mode.samples_end(1) // mode.hop - 24
    assert plan_chunk(mode, 5, 24 * 160, closed=True) is None  # nothing left


def test_stream_errors_are_clear(setup):
    _, loaded, _ = setup
    streams = DiarizationStreams(loaded, max_streams=1)
    with pytest.raises(OASRError, match="unknown streaming mode 'fast'"):
        streams.open("fast")
    streams.open(stream_id="x")
    with pytest.raises(StreamCapacityError):
        streams.open()
    with pytest.raises(OASRError, match="no open diarization stream"):
        streams.push("y", np.zeros(10, np.float32))
    streams.abort("x")
    streams.open(stream_id="y")  # the slot is free again
