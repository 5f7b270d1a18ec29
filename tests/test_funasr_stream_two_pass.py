"""The two-pass final (``StreamingConfig.final_model``, ``--final-model``): FunASR's online Paraformer streams its
partials while an offline model beside it transcribes each finished utterance's audio, and that transcript is
the utterance's final. The tiny folders of tests/data/funasr/ are FunASR's pair (paraformer_streaming online,
paraformer offline, whose goldens in paraformer.json are FunASR's ``generate`` on the whole clips); SenseVoice as
the final model shows that the pass knows neither family."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

import oasr
from oasr.cli import main
from oasr.engine.combined import Engine
from oasr.engine.final_pass import FinalPass
from oasr.engine.streams import StreamingEngine
from oasr.errors import UnsupportedOptionError
from oasr.models.capabilities import ModelCapabilities
from oasr.streaming.endpointing import EndpointConfig, EndpointRule
from oasr.streaming.types import StreamEvent, StreamingConfig, StreamingUnsupportedError, StreamOptions
from oasr.streaming.utterances import UtteranceAudio
from tests.speech_data import audio_path, require_speech_data

DATA = Path(__file__).parent / "data" / "funasr"
ONLINE, OFFLINE, SENSE_VOICE = DATA / "paraformer_streaming", DATA / "paraformer", DATA / "sense_voice"
PIECE = 9600  # 600 ms: one step of the online model at FunASR's chunk_size [0, 10, 5]


def goldens(name: str) -> dict:
    return json.loads((DATA / f"{name}.json").read_text(encoding="utf-8"))


def clip_paths() -> list[str]:
    by_id = {e["id"]: e for e in require_speech_data()}
    return [str(audio_path(by_id[name])) for name in goldens("paraformer")["clips"]]


def clips() -> list[np.ndarray]:
    return [sf.read(path, dtype="float32")[0] for path in clip_paths()]


@pytest.fixture(scope="module")
def online():
    return oasr.from_pretrained(ONLINE, device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def offline():
    return oasr.from_pretrained(OFFLINE, device="cpu", dtype="float32")


def stream_in_pieces(engine: StreamingEngine, audio: np.ndarray, options: StreamOptions | None = None
                     ) -> list[list[StreamEvent]]:
    """The events after each 600 ms piece (the last piece closes the stream; its list runs to the end)."""
    stream_id = engine.open(options or StreamOptions())
    starts = range(0, len(audio), PIECE)
    by_piece = []
    for index, start in enumerate(starts):
        engine.push(stream_id, audio[start: start + PIECE])
        if index == len(starts) - 1:
            engine.close(stream_id)
        events: list[StreamEvent] = []
        while engine.has_ready_work():
            events += engine.step().events
        by_piece.append(events)
    assert not engine.has_unfinished()
    return by_piece


def test_the_final_is_the_offline_golden_while_the_partials_stay_funasrs_online_ones(online) -> None:
    engine = StreamingEngine(online, StreamingConfig(final_model=str(OFFLINE)))
    for audio, partials, text, token_ids in zip(clips(), goldens("paraformer_streaming")["partials"],
                                                goldens("paraformer")["texts"], goldens("paraformer")["token_ids"],
                                                strict=True):
        by_piece = stream_in_pieces(engine, audio)
        streamed = [[t for e in events if e.final_model is None for t in e.new_token_ids] for events in by_piece]
        assert [online.tokenizer.decode(ids) for ids in streamed] == partials
        events = [e for events in by_piece for e in events]
        finals = [e for e in events if e.final]
        assert len(finals) == 1 and finals[0] is events[-1] and finals[0].closed  # one utterance, its final last
        assert finals[0].final_model == str(OFFLINE.resolve())
        assert (finals[0].text, list(finals[0].token_ids)) == (text, token_ids)


def test_each_endpointed_utterance_gets_the_offline_transcript_of_its_own_audio(online, offline) -> None:
    audio = clips()[0]  # 2.99 s: an utterance ends after 1.8 s (three steps), the rest is the second
    options = StreamOptions(endpointing=EndpointConfig(rules=(EndpointRule(False, 0.0, 1.8, "max_utterance"),)))
    events = [e for events in stream_in_pieces(StreamingEngine(online, StreamingConfig(final_model=str(OFFLINE))),
                                               audio, options) for e in events]
    finals = [e for e in events if e.final]
    assert [(f.utterance, f.endpoint, f.closed, f.start_s) for f in finals] == [
        (0, "max_utterance", False, 0.0), (1, None, True, pytest.approx(1.8))]
    cut = round(finals[0].end_s * 16_000)
    assert cut == 3 * PIECE
    expected = [t.text for t in oasr.transcribe([audio[:cut], audio[cut:]], offline)]
    assert [f.text for f in finals] == expected and all(expected)
    # What streamed is what streams without the second pass; only the finals differ.
    alone = [e for events in stream_in_pieces(StreamingEngine(online), audio, options) for e in events]
    assert [t for e in events if e.final_model is None for t in e.new_token_ids] == [
        t for e in alone for t in e.new_token_ids]
    assert [f.text for f in finals] != [e.text for e in alone if e.final]


def test_any_offline_model_can_give_the_final(online) -> None:
    # SenseVoice's BPE and its language and ITN queries: the pass reads the final model's record and tokenizer.
    sense_voice = oasr.from_pretrained(SENSE_VOICE, device="cpu", dtype="float32")
    audio = clips()[1]
    events = [e for events in stream_in_pieces(StreamingEngine(online, StreamingConfig(
        final_model=str(SENSE_VOICE))), audio) for e in events]
    expected = oasr.transcribe(audio, sense_voice)[0]
    assert events[-1].final_model == str(SENSE_VOICE.resolve())
    assert (events[-1].text.strip(), list(events[-1].token_ids)) == (expected.text, expected.token_ids)


def test_transcribe_stream_prints_the_final_models_transcripts(capsys) -> None:
    assert main(["transcribe", *clip_paths(), "--model", str(ONLINE), "--stream", "--final-model", str(OFFLINE),
                 "--device", "cpu", "--output-format", "jsonl", "--quiet"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert [row["text"] for row in rows] == goldens("paraformer")["texts"]
    assert [row["token_ids"] for row in rows] == goldens("paraformer")["token_ids"]


def test_a_final_model_without_stream_is_refused(capsys) -> None:
    assert main(["transcribe", clip_paths()[0], "--model", str(OFFLINE), "--final-model", str(OFFLINE),
                 "--device", "cpu", "--quiet"]) != 0
    assert "--final-model need --stream" in capsys.readouterr().err


def test_a_model_that_does_not_stream_takes_no_final_model(offline) -> None:
    with pytest.raises(StreamingUnsupportedError, match="final_model .* does not stream"):
        Engine(offline, streaming=StreamingConfig(final_model=str(OFFLINE)))


def test_a_final_model_that_cannot_transcribe_or_serve_the_language_is_refused_naming_the_option(offline) -> None:
    class TranslatesOnly:
        capabilities = ModelCapabilities(runner="frame_sync", decode_strategies=("cif_greedy",), tasks=("translate",))

    with pytest.raises(UnsupportedOptionError, match="final_model .* cannot transcribe"):
        FinalPass(type("Loaded", (), {"model": TranslatesOnly(), "name": "translator"})())
    final = FinalPass(offline)
    final.check("s", None)
    with pytest.raises(UnsupportedOptionError, match="final_model .*language"):
        final.check("s", "en")


def test_a_closed_stream_aborted_while_its_final_is_transcribed_gets_nothing_more(offline) -> None:
    final = FinalPass(offline)
    final.check("s", None)
    final.open("s", None)
    final.push("s", clips()[0])
    partial = final.end_utterance(StreamEvent("s", 0, (5,), (4, 5), "online", 0.0, 3.0, final=True, closed=True), 0)
    assert (partial.final, partial.closed, partial.new_token_ids, partial.text) == (False, False, (5,), "online")
    assert final.has_unfinished() and final.engine.has_unfinished()
    assert final.abort("s") and not final.has_unfinished() and not final.engine.has_unfinished()
    assert final.step() == [] and not final.abort("s")


def test_utterance_audio_cuts_at_each_end_and_keeps_the_rest() -> None:
    audio = UtteranceAudio()
    for piece in np.split(np.arange(10, dtype=np.float32), [3, 7]):
        audio.push(piece)
    assert audio.cut(4).tolist() == [0, 1, 2, 3]
    assert audio.cut(4).tolist() == []  # an end before the kept start takes nothing
    audio.push(np.array([10.0], dtype=np.float32))
    assert audio.cut(100).tolist() == [4, 5, 6, 7, 8, 9, 10] and audio.start == 11
    audio.push(np.array([11.0], dtype=np.float32))
    assert audio.cut().tolist() == [11]


def test_serve_final_model_travels_to_the_engine_core_in_the_streaming_config(monkeypatch) -> None:
    import oasr.serving.app

    calls = []
    monkeypatch.setattr(oasr.serving.app, "serve", lambda model, settings, **kwargs: calls.append(kwargs))
    assert main(["serve", "--model", str(ONLINE), "--device", "cpu", "--final-model", str(OFFLINE)]) == 0
    assert main(["serve", "--model", str(ONLINE), "--device", "cpu", "--final-model", str(OFFLINE),
                 "--max-streams", "8"]) == 0
    assert [c["streaming"] for c in calls] == [StreamingConfig(final_model=str(OFFLINE)),
                                               StreamingConfig(max_streams=8, final_model=str(OFFLINE))]


def test_a_final_model_that_does_not_load_is_refused_naming_the_option(tmp_path: Path, capsys) -> None:
    missing = tmp_path / "no-such-model"
    assert main(["transcribe", clip_paths()[0], "--model", str(ONLINE), "--stream", "--final-model", str(missing),
                 "--device", "cpu", "--quiet"]) != 0
    err = capsys.readouterr().err
    assert f"oasr: error: final_model {missing}:" in err and "Traceback" not in err
