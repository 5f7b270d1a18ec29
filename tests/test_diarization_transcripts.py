"""Speakers on transcripts: ``oasr serve --model tiny.en --diarization-model TINY`` answers ``diarized_json``
(streamed too), ``verbose_json``, srt and vtt with speakers, and ``oasr transcribe --diarization-model`` writes the
same. The speakers checked against are transformers' own segments of the two-speaker mixture
(``extract_speaker_dict``), not OASR's: each word takes the reference speaker talking most within it, each
segment likewise, and a segment splits into speaker turns where its words change speaker."""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import numpy as np
import pytest

from nemotron3_diarization_reference import two_speaker_case
from oasr.audio import load_audio
from oasr.cli import main
from oasr.diarization.assign import segment_turns, speaker_letter, speaker_of
from oasr.diarization.types import SpeakerSegment
from oasr.serving.app import build_app
from oasr.types import Segment, Word
from serving_harness import running_server, small_engine


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    checkpoint, wav, expected = two_speaker_case(tmp_path_factory.mktemp("diarized"))
    activity = [SpeakerSegment(s["Start"], s["End"], s["Speaker"]) for s in expected]
    return checkpoint, wav, activity


@pytest.fixture(scope="module")
def server(case):
    from oasr.serving.settings import ServerSettings

    checkpoint, _, _ = case
    engine = small_engine("tiny.en", mode="thread")
    try:
        settings = ServerSettings(served_model_name="tiny.en", diarization_model=str(checkpoint),
                                  diarization_device="cpu")
        with running_server(build_app(engine, settings)) as url:
            yield url
    finally:
        engine.shutdown()


def post(server, wav, **fields) -> httpx.Response:
    response = httpx.post(f"{server}/v1/audio/transcriptions", files={"file": (wav.name, wav.read_bytes())},
                          data={"model": "tiny.en", **fields}, timeout=180)
    assert response.status_code == 200, response.text
    return response


@pytest.fixture(scope="module")
def words(server, case):
    """The transcript's words with the server's speakers (verbose_json, word granularity)."""
    _, wav, _ = case
    body = post(server, wav, response_format="verbose_json", **{"timestamp_granularities[]": "word"}).json()
    return body["words"]


@pytest.fixture(scope="module")
def diarized(server, case):
    _, wav, _ = case
    return post(server, wav, response_format="diarized_json").json()


def unspaced(text: str) -> str:
    """Text compared without its spaces: the words given back are stripped, so where a word had no leading
    space (a hyphenated word's second part) is lost."""
    return "".join(text.split())


def expected_turns(words: list[dict], activity) -> list[tuple[str, str]]:
    """(speaker, text without spaces) of each run of words with one reference speaker."""
    runs: list[tuple[str, list[str]]] = []
    for w in words:
        speaker = speaker_letter(speaker_of(w["start"], w["end"], activity))
        if not runs or runs[-1][0] != speaker:
            runs.append((speaker, []))
        runs[-1][1].append(w["word"])
    return [(speaker, unspaced("".join(ws))) for speaker, ws in runs]


def test_each_word_and_verbose_segment_gets_the_reference_speaker(server, case, words):
    _, wav, activity = case
    assert len(words) > 5
    for w in words:
        assert w["speaker"] == speaker_letter(speaker_of(w["start"], w["end"], activity)), w
    assert len({w["speaker"] for w in words}) > 1  # the random model hears several speakers
    body = post(server, wav, response_format="verbose_json").json()
    assert body["segments"] and "words" not in body
    for seg in body["segments"]:
        assert seg["speaker"] == speaker_letter(speaker_of(seg["start"], seg["end"], activity))


def test_diarized_json_has_openai_shape_and_one_segment_per_reference_speaker_turn(diarized, case, words):
    _, _, activity = case
    body = diarized
    assert set(body) == {"task", "duration", "text", "segments", "usage"} and body["task"] == "transcribe"
    assert body["usage"] == {"type": "duration", "seconds": body["duration"]}
    segments = body["segments"]
    for i, seg in enumerate(segments):
        assert set(seg) == {"type", "id", "start", "end", "text", "speaker"}
        assert seg["type"] == "transcript.text.segment" and seg["id"] == f"seg_{i}"
        assert seg["start"] <= seg["end"]
    # words are split at the speaker changes between them (no segment of tiny.en's here spans one alone)
    turns = expected_turns(words, activity)
    assert len(turns) > 2
    assert [(s["speaker"], unspaced(s["text"])) for s in segments] == turns
    assert unspaced("".join(s["text"] for s in segments)) == unspaced(body["text"])


def test_subtitles_carry_the_speaker_of_each_turn(server, case, diarized):
    _, wav, _ = case
    segments = diarized["segments"]
    vtt = post(server, wav, response_format="vtt").text
    assert vtt.startswith("WEBVTT\n\n")
    voices = re.findall(r"\n(\d\d:\d\d:\d\d\.\d{3}) --> (\d\d:\d\d:\d\d\.\d{3})\n<v Speaker ([A-Z]+)>(.*)\n", vtt)
    assert [(v[2], v[3]) for v in voices] == [(s["speaker"], s["text"]) for s in segments]
    srt = post(server, wav, response_format="srt").text
    cues = re.findall(r"(\d+)\n\S+ --> \S+\n\[Speaker ([A-Z]+)\] (.*)\n", srt)
    assert [(int(c[0]), c[1], c[2]) for c in cues] == [(i, s["speaker"], s["text"])
                                                      for i, s in enumerate(segments, start=1)]


def test_streamed_diarized_json_sends_text_deltas_then_the_segments(server, case, diarized):
    _, wav, _ = case
    whole = diarized
    with httpx.stream("POST", f"{server}/v1/audio/transcriptions", files={"file": (wav.name, wav.read_bytes())},
                      data={"model": "tiny.en", "response_format": "diarized_json", "stream": "true"},
                      timeout=180) as response:
        assert response.status_code == 200
        events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]
    kinds = [e["type"] for e in events]
    num_deltas = kinds.count("transcript.text.delta")
    assert num_deltas >= 1 and kinds[-1] == "transcript.text.done"
    num_segments = len(whole["segments"])
    assert kinds == ["transcript.text.delta"] * num_deltas + ["transcript.text.segment"] * num_segments + [
        "transcript.text.done"]
    assert "".join(e["delta"] for e in events[:num_deltas]) == events[-1]["text"] == whole["text"]
    assert events[num_deltas:-1] == whole["segments"]


def test_transcribe_writes_the_servers_speakers(diarized, case, tmp_path, capsys):
    checkpoint, wav, activity = case
    argv = ["transcribe", str(wav), "--model", "tiny.en", "--device", "cpu", "--diarization-model",
            str(checkpoint), "--output-dir", str(tmp_path)]
    for fmt in ("diarized_json", "json"):
        assert main([*argv, "--output-format", fmt]) == 0, capsys.readouterr().err
    written = json.loads((tmp_path / "two speakers.diarized_json").read_text())
    assert written["segments"] == diarized["segments"] and written["text"] == diarized["text"]
    labelled = json.loads((tmp_path / "two speakers.json").read_text())
    for segment in labelled["segments"]:
        assert segment["speaker"] == speaker_letter(speaker_of(segment["start"], segment["end"], activity))
        for w in segment["words"]:
            assert w["speaker"] == speaker_letter(speaker_of(w["start"], w["end"], activity))


def test_transcribe_refuses_speakers_where_a_format_has_no_place_for_them(case, capsys):
    checkpoint, wav, _ = case
    assert main(["transcribe", str(wav), "--output-format", "diarized_json"]) == 2
    assert "needs --diarization-model" in capsys.readouterr().err
    assert main(["transcribe", str(wav), "--diarization-model", str(checkpoint)]) == 2
    assert "has no place for speakers" in capsys.readouterr().err


def test_a_segment_splits_where_its_words_change_speaker():
    activity = [SpeakerSegment(0.0, 2.0, 0), SpeakerSegment(1.6, 4.0, 1)]
    words = (Word(" Hello", 0.2, 0.6, 1.0), Word(" there.", 0.6, 1.5, 1.0), Word(" Hi,", 1.7, 2.6, 1.0),
             Word(" you.", 2.6, 3.5, 1.0))
    segment = Segment(0.0, 3.8, "Hello there. Hi, you.", words=words)
    turns = segment_turns(segment, activity)
    assert [(t.start, t.end, t.text, t.label) for t in turns] == [(0.0, 1.7, "Hello there.", "A"),
                                                                  (1.7, 3.8, "Hi, you.", "B")]
    assert [t.words for t in turns] == [words[:2], words[2:]]
    # without word times the segment stays whole, with the speaker talking most within it (B: 2.2 s, A: 2 s)
    (whole,) = segment_turns(Segment(0.0, 3.8, "Hello there. Hi, you."), activity)
    assert (whole.start, whole.end, whole.label) == (0.0, 3.8, "B")


def reference_activity(checkpoint, audio: np.ndarray) -> list[SpeakerSegment]:
    """transformers' segments of ``audio`` from the checkpoint on disk (``extract_speaker_dict``, 0.5)."""
    import transformers

    from nemotron3_diarization_reference import offline_logits, processor

    model = transformers.Nemotron3DiarizationForAudioFrameClassification.from_pretrained(checkpoint).eval()
    logits, mask = offline_logits(model, audio)
    found = processor(model.config.audio_config.num_mel_bins).extract_speaker_dict(logits, mask, threshold=0.5)[0]
    return [SpeakerSegment(s["Start"], s["End"], s["Speaker"]) for s in found]


def item_words(server, samples: np.ndarray) -> list[dict]:
    """The words the server times in ``samples`` decoded as a realtime turn is (no timestamp tokens): an upload
    of the same float samples, verbose_json with word granularity only."""
    import io

    import soundfile as sf

    data = io.BytesIO()
    sf.write(data, samples.astype(np.float32), 16000, format="WAV", subtype="FLOAT")
    response = httpx.post(f"{server}/v1/audio/transcriptions", files={"file": ("turn.wav", data.getvalue())},
                          data={"model": "tiny.en", "response_format": "verbose_json",
                                "timestamp_granularities[]": "word"}, timeout=180)
    assert response.status_code == 200, response.text
    return response.json()["words"]


def test_realtime_items_get_segment_events_with_the_sessions_speakers(server, case):
    """Two committed turns (the mixture cut in two): before each ``completed`` come the item's
    ``conversation.item.input_audio_transcription.segment`` events (the SDK's own type accepts them): its words
    in runs of one speaker, each speaker the reference's over the session's audio so far (so letters hold across
    items; diarizing each item alone fails this)."""
    from test_realtime import as_served, connect, events_until, next_event, pcm16_24k, send_audio, update

    checkpoint, wav, _ = case
    audio = load_audio(wav)
    cut = len(audio) // 2
    pcms = [pcm16_24k(audio[:cut]), pcm16_24k(audio[cut:])]

    async def session() -> list[dict]:
        async with connect(server, "ga", api_key="unused") as conn:
            await next_event(conn, "ga")
            await update(conn, "ga", turn_detection=None)
            events = []
            for pcm in pcms:
                await send_audio(conn, pcm)
                await conn.input_audio_buffer.commit()
                events += await events_until(conn, "ga", 1)
            return events

    events = asyncio.run(session())
    heard = [as_served(pcm) for pcm in pcms]
    activity = reference_activity(checkpoint, np.concatenate(heard))
    items = [e["item_id"] for e in events if e["type"] == "input_audio_buffer.committed"]
    offset, num_split = 0.0, 0
    for item, samples in zip(items, heard, strict=True):
        mine = [e for e in events if e.get("item_id") == item]
        kinds = [e["type"].rsplit(".", 1)[-1] for e in mine]
        num_segments = kinds.count("segment")
        assert num_segments >= 1 and kinds[-1 - num_segments :] == ["segment"] * num_segments + ["completed"]
        segments = mine[-1 - num_segments : -1]
        assert unspaced(" ".join(s["text"] for s in segments)) == unspaced(mine[-1]["transcript"])
        assert all(0.0 <= s["start"] <= s["end"] <= len(samples) / 16000 + 1e-3 for s in segments)
        shifted = [{**w, "start": w["start"] + offset, "end": w["end"] + offset} for w in item_words(server, samples)]
        assert [(s["speaker"], unspaced(s["text"])) for s in segments] == expected_turns(shifted, activity)
        num_split += num_segments > 1
        offset += len(samples) / 16000
    assert num_split  # an item was cut between two speakers' words


def test_translations_refuse_diarized_json(server, case):
    _, wav, _ = case
    response = httpx.post(f"{server}/v1/audio/translations", files={"file": (wav.name, wav.read_bytes())},
                          data={"model": "tiny.en", "response_format": "diarized_json"}, timeout=60)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "response_format" and "translations have none" in error["message"]


def test_a_core_started_with_a_diarization_model_serves_it_for_the_api_process(case, diarized):
    """``oasr serve`` starts the engine core with the diarization model beside the ASR model: the API process
    sends its diarizations there and never loads the model itself; the answers are those of the API process's
    own copy."""
    from oasr.serving.settings import ServerSettings

    checkpoint, wav, activity = case
    engine = small_engine("tiny.en", mode="process", diarization_model=str(checkpoint))
    try:
        assert engine.diarization_model == str(checkpoint)
        settings = ServerSettings(served_model_name="tiny.en", diarization_model=str(checkpoint),
                                  diarization_device="cpu")
        app = build_app(engine, settings)
        with running_server(app) as url:
            body = post(url, wav, response_format="diarized_json").json()
            route = httpx.post(f"{url}/v1/audio/diarization", files={"file": (wav.name, wav.read_bytes())},
                               timeout=120).json()
        assert body["segments"] == diarized["segments"]
        assert route["segments"] == [{"start": s.start, "end": s.end, "speaker": f"speaker_{s.speaker}"}
                                     for s in activity]
        assert app.state.diarization.engine is engine and app.state.diarization._diarizer is None
    finally:
        engine.shutdown()


def test_the_core_diarizes_the_requests_of_one_iteration_as_one_batch(case):
    from oasr.hosting.core import EngineCore, build_diarizer, build_engine
    from oasr.hosting.protocol import UNSUPPORTED_OPTION, Diarize, EngineCoreSpec

    checkpoint, wav, activity = case
    spec = EngineCoreSpec("tiny.en", "cpu", "float32", diarization_model=str(checkpoint))
    engine = build_engine(spec)
    core = EngineCore(engine, build_diarizer(spec))
    batches = []
    run = core.diarizer.run
    core.diarizer.run = lambda audio: batches.append(len(audio)) or run(audio)
    audio = load_audio(wav)
    core.handle(Diarize(1, 0.5), audio, client=0)
    core.handle(Diarize(2, 0.5), audio[: len(audio) // 2], client=1)
    updates = core.step_all(2)
    assert batches == [2]
    (whole,) = updates[0].diarizations
    (half,) = updates[1].diarizations
    assert whole.call_id == 1 and list(whole.segments) == activity
    assert half.call_id == 2 and half.error is None and half.segments
    bare = EngineCore(engine)
    bare.handle(Diarize(3, 0.5), audio)
    (refused,) = bare.step_all(1)[0].diarizations
    assert refused.error_kind == UNSUPPORTED_OPTION and "no diarization model" in refused.error


def test_the_core_runs_one_diarization_batch_per_step_and_steps_the_engine_between(case):
    """Files whose padded audio passes one batch's budget run one batch a step, shortest first, with the engine's
    requests stepped in the same steps; a file handled later waits behind the batches already planned; a client
    that drops loses its files still waiting, and nobody else's."""
    from oasr.hosting.core import EngineCore, build_diarizer, build_engine
    from oasr.hosting.protocol import AddRequest, Diarize, EngineCoreSpec
    from oasr.types import DecodeOptions

    checkpoint, wav, activity = case
    spec = EngineCoreSpec("tiny.en", "cpu", "float32", diarization_model=str(checkpoint))
    core = EngineCore(build_engine(spec), build_diarizer(spec))
    audio = load_audio(wav)
    core.diarizer.max_batch_seconds = 1.5 * len(audio) / 16_000  # room for the whole file alone, not two files
    batches = []
    run = core.diarizer.run
    core.diarizer.run = lambda rows: batches.append([len(r) for r in rows]) or run(rows)
    whole, half, third = audio, audio[: len(audio) // 2], audio[: len(audio) // 3]
    core.handle(Diarize(1, 0.5), whole)
    core.handle(Diarize(2, 0.5), half, client=1)
    core.handle(AddRequest("r", DecodeOptions(), partial=True), whole)
    first = core.step_all(2)
    assert batches == [[len(half)]] and core.has_ready_work
    (answer,) = first[1].diarizations
    assert answer.call_id == 2 and answer.error is None and first[0].deltas  # the request stepped too
    core.handle(Diarize(3, 0.5), third)  # planned after the whole file, though shorter
    core.handle(Diarize(4, 0.5), third, client=1)
    core.drop_client(1)
    (answer,) = core.step_all(1)[0].diarizations
    assert answer.call_id == 1 and list(answer.segments) == activity
    (answer,) = core.step_all(1)[0].diarizations
    assert answer.call_id == 3 and batches == [[len(half)], [len(whole)], [len(third)]]
    while core.has_ready_work:  # the request's remaining steps; client 1's file never runs
        assert not any(update.diarizations for update in core.step_all(1).values())
    assert len(batches) == 3
