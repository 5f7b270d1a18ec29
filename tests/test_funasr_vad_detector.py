"""FSMN-VAD as a registered speech detector (``--vad fsmn:DIR``): the registry's detector specs (a name, and a
model folder for detectors that read one), and long audio cut at FSMN-VAD's own segments, which equal FunASR's
(tests/data/funasr/fsmn_vad.json's ``offline``, from funasr 1.4.16's ``AutoModel.generate``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oasr.cli import main
from oasr.transcription.spans import SpanPlanner
from oasr.vad import VAD_DETECTORS, DetectorSpec, DetectorSpecError, load_detector
from oasr.vad.planner import Window, WindowPlanner
from tests.speech_data import audio_path, clips, require_speech_data

DATA = Path(__file__).parent / "data" / "funasr"
FSMN = f"fsmn:{DATA / 'fsmn_vad'}"
SAMPLES_PER_MS = 16


def golden() -> dict:
    return json.loads((DATA / "fsmn_vad.json").read_text())


@pytest.fixture(scope="module")
def shared():
    expected = golden()
    return list(zip(clips(expected["clips"]), expected["offline"], strict=True))


def test_a_spec_names_the_detector_and_its_folder() -> None:
    assert DetectorSpec.parse(FSMN) == DetectorSpec("fsmn", str(DATA / "fsmn_vad"))
    assert DetectorSpec.parse("silero") == DetectorSpec("silero") and str(DetectorSpec.parse(FSMN)) == FSMN
    assert type(load_detector(FSMN)).__name__ == "FsmnVAD"
    assert {name: VAD_DETECTORS.get(name).model_folder for name in VAD_DETECTORS.names()} == {
        "silero": "none", "energy": "none", "fsmn": "required"}


@pytest.mark.parametrize(("spec", "message"), [
    ("fsmn", "the fsmn VAD needs its model folder: fsmn:FOLDER"),
    ("energy:/somewhere", "the energy VAD takes no model folder"),
    ("fsmn:", "names no folder"),
    ("webrtc", "unknown VAD detector 'webrtc'"),
])
def test_a_spec_that_does_not_fit_its_detector_is_refused(spec: str, message: str) -> None:
    with pytest.raises(DetectorSpecError, match=message):
        load_detector(spec)


def test_the_planner_cuts_at_funasrs_segments(shared) -> None:
    planner = WindowPlanner(load_detector(FSMN), 10 * 16_000)
    for clip, segments in shared:
        assert planner.plan([clip.audio])[0] == [Window(a * SAMPLES_PER_MS, b * SAMPLES_PER_MS) for a, b in segments]
    assert any(not segments for _, segments in shared) and any(segments for _, segments in shared)


def test_a_segment_longer_than_a_window_is_cut_into_equal_parts(shared) -> None:
    clip, [[start_ms, end_ms]] = shared[2]
    window = 2 * 16_000
    spans = SpanPlanner(FSMN, window)(clip.audio)  # what offline transcription and the server cut with
    start, end = start_ms * SAMPLES_PER_MS, end_ms * SAMPLES_PER_MS
    assert len(spans) == -(-(end - start) // window) == 3
    assert spans[0][0] == start and spans[-1][1] == end
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:])) and all(e - s <= window for s, e in spans)


def test_transcribe_takes_the_fsmn_spec_and_refuses_a_bad_one(shared, capsys) -> None:
    path = str(audio_path({e["id"]: e for e in require_speech_data()}[shared[0][0].id]))
    command = ["transcribe", path, "--model", str(DATA / "paraformer"), "--device", "cpu", "--quiet"]
    assert main([*command, "--vad", FSMN]) == 0
    capsys.readouterr()
    assert main([*command, "--vad", "fsmn"]) != 0
    assert "the fsmn VAD needs its model folder" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # the command line names no such detector
        main([*command, "--vad", "webrtc"])
    assert "unknown VAD detector 'webrtc'" in capsys.readouterr().err


def test_the_state_machine_fed_in_200ms_pieces_gives_funasrs_streaming_events(shared) -> None:
    """FunASR's streaming VAD (``generate(input=piece, cache=..., is_final=...)``, 200 ms pieces): after each
    piece the frames its online frontend has made (an LFR-5 frame waits for 2 frames of right context; the last
    piece makes the rest) go through the state machine, which reports a segment's start and end as it finds
    them. The network is causal (``rorder: 0``), so the whole clip's scores are the stream's."""
    from dataclasses import replace

    from oasr.vad.fsmn_segments import (
        DYNAMIC_FIRST_END_SILENCE_MS,
        DYNAMIC_SPEECH_NOISE_THRES,
        FsmnSegmenter,
        frame_decibels,
    )

    expected = golden()
    detector = load_detector(FSMN)
    step = expected["chunk_ms"] * SAMPLES_PER_MS
    # Under 10 s of speech FunASR's streaming call also takes the dynamic schedule's first entry.
    config = replace(detector.segment_config, max_end_silence_ms=DYNAMIC_FIRST_END_SILENCE_MS,
                     speech_noise_thres=DYNAMIC_SPEECH_NOISE_THRES)
    for (clip, _), events in zip(shared, expected["streaming"], strict=True):
        silence = detector.frame_silence(clip.audio).tolist()
        decibels = frame_decibels(clip.audio, len(silence))
        segmenter, done, got = FsmnSegmenter(config), 0, []
        num_pieces = -(-len(clip.audio) // step)
        for piece in range(num_pieces):
            final = piece == num_pieces - 1
            received = min((piece + 1) * step, len(clip.audio))
            ready = len(silence) if final else max(0, (received - 400) // 160 + 1 - 2)
            got.append(segmenter.feed(silence[done:ready], decibels[done:ready], final))
            done = max(done, ready)
        assert got == events
    assert any(any(e) for e in expected["streaming"])
