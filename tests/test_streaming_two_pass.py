"""The two-pass final is not FunASR's alone: a tiny random Nemotron 3.5 (cache-aware, transducer, a language
prompt) streams while Whisper tiny.en, an autoregressive model, gives each utterance's final over several steps
of its own engine, stepped inside the streaming engine's. tests/test_funasr_stream_two_pass.py has FunASR's pair."""

from __future__ import annotations

import pytest

import oasr
from oasr.errors import UnsupportedOptionError
from oasr.engine.streams import StreamingConfig, StreamingEngine, StreamOptions
from nemotron_reference import build_reference, clips, save


@pytest.fixture(scope="module")
def streaming(tmp_path_factory):
    directory = save(build_reference("nemotron3_5_asr"), tmp_path_factory.mktemp("nemotron3_5"))
    return oasr.from_pretrained(directory, device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def engine(streaming) -> StreamingEngine:
    return StreamingEngine(streaming, StreamingConfig(max_streams=2, final_model="tiny.en"))


def test_streams_side_by_side_each_get_whispers_transcript_as_their_final(engine, tiny_en) -> None:
    audio = {"a": clips()[1], "b": clips()[2]}  # 3 s and 5 s of the JFK recording
    for stream_id, samples in audio.items():
        engine.open(StreamOptions(lookahead=1, language="en"), stream_id=stream_id)
        engine.push(stream_id, samples)
        engine.close(stream_id)
    events, steps_after_close = {s: [] for s in audio}, 0
    while engine.has_unfinished():
        result = engine.step()
        steps_after_close += not result.chunks  # Whisper decoding on after the streams' last chunks
        for event in result.events:
            events[event.stream_id].append(event)
    assert steps_after_close >= 2
    expected = {s: t.text for s, t in zip(audio, oasr.transcribe(list(audio.values()), tiny_en))}
    for stream_id, stream_events in events.items():
        final = stream_events[-1]
        assert [e.final for e in stream_events].count(True) == 1 and final.closed
        assert final.final_model == tiny_en.name and final.new_token_ids == ()
        assert final.text.strip() == expected[stream_id] and "fellow" in expected["a"]
        assert all(e.final_model is None for e in stream_events[:-1])  # the partials are Nemotron's


def test_a_language_the_final_model_does_not_serve_is_refused_naming_it(engine) -> None:
    free = engine.scheduler.num_free_slots
    with pytest.raises(UnsupportedOptionError, match="final_model .*(English|en)"):
        engine.open(StreamOptions(lookahead=1, language="de"))
    assert engine.scheduler.num_free_slots == free and not engine.has_unfinished()
