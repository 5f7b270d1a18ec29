"""``oasr diarize`` (RTTM) and ``POST /v1/audio/diarization`` (JSON segments) on a tiny random diarization
checkpoint on disk and a two-speaker mixture of the shared clips; the segments are transformers'
``extract_speaker_dict`` of the same audio."""

from __future__ import annotations

import httpx
import pytest

from nemotron3_diarization_reference import mixture, two_speaker_case
from oasr.audio import load_audio
from oasr.cli import main
from oasr.diarization.rttm import recording_id
from oasr.serving.app import build_app
from serving_harness import running_server, small_engine, wav_bytes


@pytest.fixture(scope="module")
def model_and_audio(tmp_path_factory):
    return two_speaker_case(tmp_path_factory.mktemp("diarize"))


def test_diarize_prints_rttm_lines_of_the_reference_segments(model_and_audio, capsys):
    checkpoint, wav, expected = model_and_audio
    assert main(["diarize", str(wav), "--model", str(checkpoint), "--device", "cpu"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(expected)
    for line, seg in zip(lines, expected):
        fields = line.split(" ")
        assert len(fields) == 10 and fields[:3] == ["SPEAKER", "two_speakers", "1"]
        assert fields[5:7] == ["<NA>", "<NA>"] and fields[8:] == ["<NA>", "<NA>"]
        assert float(fields[3]) == pytest.approx(seg["Start"], abs=1e-9)
        assert float(fields[4]) == pytest.approx(seg["End"] - seg["Start"], abs=1e-3)
        assert fields[7] == f"speaker_{seg['Speaker']}"


def test_diarize_refuses_bad_input_with_a_clear_error(model_and_audio, tmp_path, capsys):
    checkpoint, wav, _ = model_and_audio
    bad = tmp_path / "noise.wav"
    bad.write_bytes(b"not audio at all")
    assert main(["diarize", str(bad), "--model", str(checkpoint), "--device", "cpu"]) == 2
    assert "oasr: error:" in capsys.readouterr().err
    assert main(["diarize", str(wav), "--model", str(tmp_path / "nowhere"), "--device", "cpu"]) == 2
    assert "is neither a diarization model directory" in capsys.readouterr().err
    assert main(["diarize", str(wav), "--model", str(checkpoint), "--threshold", "1.5"]) == 2
    assert "--threshold" in capsys.readouterr().err


def test_recording_ids_have_no_directories_extension_or_spaces():
    assert recording_id("/data/meeting one.flac") == "meeting_one"
    assert recording_id("C:\\audio\\call.wav") == "call"
    assert recording_id(".hidden") == ".hidden"


@pytest.fixture(scope="module")
def server(model_and_audio):
    from oasr.serving.settings import ServerSettings

    checkpoint, _, _ = model_and_audio
    engine = small_engine("tiny.en", mode="thread")
    try:
        settings = ServerSettings(served_model_name="tiny.en", diarization_model=str(checkpoint),
                                  diarization_device="cpu")
        with running_server(build_app(engine, settings)) as url:
            yield url
    finally:
        engine.shutdown()


def test_diarization_route_answers_the_reference_segments(server, model_and_audio):
    _, wav, expected = model_and_audio
    response = httpx.post(f"{server}/v1/audio/diarization", files={"file": (wav.name, wav.read_bytes())},
                          timeout=120)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model"] == "tiny-diarization" and body["duration"] == pytest.approx(len(load_audio(wav)) / 16000, abs=1e-3)
    assert body["segments"] == [{"start": s["Start"], "end": s["End"], "speaker": f"speaker_{s['Speaker']}"}
                                for s in expected]


def test_diarization_route_refuses_bad_requests(server):
    url = f"{server}/v1/audio/diarization"
    cases = [
        ({"file": ("x.wav", b"garbage")}, {}, 400, "invalid_audio"),
        ({"file": ("x.wav", wav_bytes(mixture(2)[:16000]))}, {"threshold": "2"}, 400, None),
        ({"file": ("x.wav", wav_bytes(mixture(2)[:16000]))}, {"language": "en"}, 400, None),
        ({"file": ("x.wav", wav_bytes(mixture(2)[:16000]))}, {"model": "other"}, 404, "model_not_found"),
        (None, {"threshold": "0.5"}, 400, None),
    ]
    for files, data, status, code in cases:
        response = httpx.post(url, files=files, data=data, timeout=60)
        assert response.status_code == status, (data, response.text)
        error = response.json()["error"]
        assert error["message"] and (code is None or error["code"] == code)


def test_a_server_without_a_diarization_model_answers_404_and_refuses_diarized_json():
    from oasr.serving.settings import ServerSettings

    engine = small_engine("tiny.en", mode="thread")
    audio = {"file": ("x.wav", wav_bytes(mixture(2)[:16000]))}
    try:
        with running_server(build_app(engine, ServerSettings(served_model_name="tiny.en"))) as url:
            response = httpx.post(f"{url}/v1/audio/diarization", files={"file": ("x.wav", b"RIFF")}, timeout=60)
            refused = [httpx.post(f"{url}/v1/audio/transcriptions", files=audio, timeout=60,
                                  data={"model": "tiny.en", "response_format": "diarized_json", **extra})
                       for extra in ({}, {"stream": "true"})]
            # the formats that carry speakers on a server with a diarization model are plain ones here
            plain = httpx.post(f"{url}/v1/audio/transcriptions", files=audio, timeout=60,
                               data={"model": "tiny.en", "response_format": "vtt"})
        assert response.status_code == 404 and "--diarization-model" in response.json()["error"]["message"]
        for answer in refused:
            assert answer.status_code == 400, answer.text
            error = answer.json()["error"]
            assert error["param"] == "response_format" and "--diarization-model" in error["message"]
        assert plain.status_code == 200 and "<v " not in plain.text
    finally:
        engine.shutdown()


def test_each_span_takes_the_speaker_who_talks_most_within_it():
    from oasr.diarization.assign import speaker_letter, speaker_of
    from oasr.diarization.types import SpeakerSegment

    activity = [SpeakerSegment(0.0, 2.0, 0), SpeakerSegment(1.5, 4.0, 1), SpeakerSegment(3.0, 3.5, 0),
                SpeakerSegment(6.0, 7.0, 2)]
    assert speaker_of(0.0, 1.8, activity) == 0
    assert speaker_of(1.0, 3.6, activity) == 1  # 1: 2.1 s, 0: 1.0 + 0.5 s
    assert speaker_of(1.5, 2.5, activity) == 1  # 1.0 s against 0.5 s
    assert speaker_of(1.5, 2.0, activity) == 0  # 0.5 s each: the earlier arrival
    assert speaker_of(4.5, 5.0, activity) == 1  # nobody talks: the nearest activity
    assert speaker_of(0.0, 1.0, []) is None
    assert [speaker_letter(i) for i in (0, 1, 25, 26, 27)] == ["A", "B", "Z", "AA", "AB"]


def test_requests_that_arrive_while_the_model_runs_are_diarized_together():
    """The first request runs alone; three that queue meanwhile run in one batch, each with its own threshold,
    and a failure reaches every caller of its batch."""
    import threading
    from types import SimpleNamespace

    import numpy as np

    from oasr.serving.diarization import DiarizationService

    running, release = threading.Event(), threading.Event()

    class Diarizer:  # frames of one speaker at probability ``level`` (the audio's first sample)
        loaded = SimpleNamespace(frame_seconds=0.01)

        def probabilities(self, audio):
            if not running.is_set():
                running.set()
                release.wait(30)
            if any(a[0] < 0 for a in audio):
                raise RuntimeError("broken")
            return [np.full((len(a) // 160, 1), a[0], np.float32) for a in audio]

    service = DiarizationService("tiny")
    service._diarizer = Diarizer()
    results: dict[str, object] = {}

    def call(name: str, level: float, threshold: float = 0.5) -> None:
        try:
            results[name] = service.diarize(np.full(16000, level, np.float32), name, threshold)
        except RuntimeError as exc:
            results[name] = exc

    threads = [threading.Thread(target=call, args=("first", 0.9))]
    threads[0].start()
    assert running.wait(30)
    threads += [threading.Thread(target=call, args=args) for args in
                (("loud", 0.9), ("quiet", 0.2), ("strict", 0.9, 0.95))]
    for t in threads[1:]:
        t.start()
    while len(service._queued) < 3:
        threading.Event().wait(0.01)
    release.set()
    for t in threads:
        t.join(30)
    assert service.batch_sizes == [1, 3]
    assert [(s.start, s.end, s.speaker) for s in results["first"].segments] == [(0.0, 1.0, 0)]
    assert [(s.start, s.end) for s in results["loud"].segments] == [(0.0, 1.0)]
    assert results["quiet"].segments == () and results["strict"].segments == ()
    failing = [threading.Thread(target=call, args=(name, level)) for name, level in (("bad", -1.0), ("ok", 0.9))]
    with service._run_lock:  # both queue before either runs: one batch, which fails for both
        for t in failing:
            t.start()
        while len(service._queued) < 2:
            threading.Event().wait(0.01)
    for t in failing:
        t.join(30)
    assert isinstance(results["bad"], RuntimeError) and isinstance(results["ok"], RuntimeError)
