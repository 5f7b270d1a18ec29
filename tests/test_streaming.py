"""Streams through the cache-aware runtime against transformers' own streaming ``generate``: a tiny random
``NemotronAsrStreamingForRNNT`` checkpoint, audio pushed in pieces of random sizes, several streams at once; the
engine's bookkeeping (slots, join and leave, abort, endpoints) and its refusal of models that cannot stream."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

import oasr
from oasr.engine.combined import Engine
from oasr.engine.engine import ASREngine
from oasr.errors import OASRError
from oasr.models.loader import LoadedModel
from oasr.streaming.endpointing import EndpointConfig, EndpointRule
from oasr.engine.streams import (
    StreamCapacityError,
    StreamingConfig,
    StreamingEngine,
    StreamingUnsupportedError,
    StreamOptions,
)
from oasr.models.nemotron3_5.prompts import DEFAULT_PROMPT_DICTIONARY
from oasr.types import DecodeOptions
from nemotron_reference import build_reference, clips, feature_extractor, reference_features, reference_streamed, save


@dataclass
class Setup:
    reference: torch.nn.Module
    loaded: LoadedModel
    audio: list[np.ndarray]
    features: list[torch.Tensor]  # each clip's real reference features [1, T, n_mels]
    directory: Path  # the saved checkpoint


def make_setup(reference: torch.nn.Module, directory: Path) -> Setup:
    loaded = oasr.from_pretrained(save(reference, directory), device="cpu", dtype="float32")
    audio = clips()
    x, lengths = reference_features(feature_extractor(reference.config.encoder_config.num_mel_bins), audio)
    return Setup(reference, loaded, audio, [x[i : i + 1, : int(n)] for i, n in enumerate(lengths)], directory)


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> Setup:
    return make_setup(build_reference(), tmp_path_factory.mktemp("nemotron"))


AUTO, GERMAN = DEFAULT_PROMPT_DICTIONARY["auto"], DEFAULT_PROMPT_DICTIONARY["de"]


@pytest.fixture(scope="module")
def setup_3_5(tmp_path_factory) -> Setup:
    """Nemotron 3.5, the joint calibrated under both prompts (so both decode a varied mix of tokens)."""
    reference = build_reference("nemotron3_5_asr", prompt_gain=1.0, calibration_prompts=(AUTO, GERMAN))
    return make_setup(reference, tmp_path_factory.mktemp("nemotron3_5"))


def run_streams(engine: StreamingEngine, audio: dict[str, np.ndarray], seed: int,
                opens_at: dict[str, int] | None = None, options: StreamOptions | None = None
                ) -> dict[str, list]:
    """Feeds each stream in pieces of random sizes, stream ``s`` joining at step ``opens_at[s]``; -> the events
    of every stream."""
    rng = np.random.default_rng(seed)
    opens_at = opens_at or {}
    position = dict.fromkeys(audio, 0)
    events: dict[str, list] = {s: [] for s in audio}
    step = 0
    while step == 0 or engine.has_unfinished() or any(s not in engine.scheduler.streams and position[s] == 0
                                                      for s in audio):
        for s, samples in audio.items():
            if opens_at.get(s, 0) == step and position[s] == 0:
                engine.open(options, stream_id=s)
            if s in engine.scheduler.streams and position[s] < len(samples):
                size = int(rng.integers(50, 5000))
                engine.push(s, samples[position[s] : position[s] + size])
                position[s] += size
                if position[s] >= len(samples):
                    engine.close(s)
        for event in engine.step().events:
            events[event.stream_id].append(event)
        step += 1
    return events


def tokens_of(events: list) -> list[int]:
    return [t for e in events for t in e.new_token_ids]


@pytest.mark.parametrize("lookahead", [0, 1, 13])
def test_streamed_tokens_equal_transformers_streaming_generate(setup: Setup, lookahead: int) -> None:
    expected = [reference_streamed(setup.reference, f, lookahead) for f in setup.features]
    assert len({tuple(e) for e in expected}) == len(expected) and all(len(set(e)) >= 5 for e in expected)
    engine = StreamingEngine(setup.loaded)
    events = run_streams(engine, {f"s{i}": a for i, a in enumerate(setup.audio)}, seed=lookahead,
                         options=StreamOptions(lookahead=lookahead))
    assert [tokens_of(events[f"s{i}"]) for i in range(len(expected))] == expected
    for i, stream_events in enumerate(events.values()):
        last = stream_events[-1]
        assert last.final and last.closed and sum(e.closed for e in stream_events) == 1
        assert list(last.token_ids) == expected[i]
        assert last.text == setup.loaded.tokenizer.decode(expected[i])


@pytest.mark.parametrize("lookahead", [0, 1, 13])
def test_nemotron_3_5_streams_in_the_language_each_stream_asks_for(setup_3_5: Setup, lookahead: int) -> None:
    setup = setup_3_5
    expected = {language: [reference_streamed(setup.reference, f, lookahead,
                                              prompt_ids=torch.tensor([prompt])) for f in setup.features]
                for language, prompt in (("auto", AUTO), ("de", GERMAN))}
    assert all(a != d for a, d in zip(expected["auto"], expected["de"], strict=True))
    assert all(len(set(e)) >= 4 for rows in expected.values() for e in rows)
    engine = StreamingEngine(setup.loaded)
    rng = np.random.default_rng(lookahead)
    for language in ("auto", "de"):  # both languages' streams in the same steps
        for i in range(len(setup.audio)):
            engine.open(StreamOptions(lookahead=lookahead, language=None if language == "auto" else language),
                        stream_id=f"{language}{i}")
    events: dict[str, list[int]] = {s: [] for s in engine.scheduler.streams}
    for s in list(events):
        samples = setup.audio[int(s[-1])]
        size = int(rng.integers(500, 4000))
        for start in range(0, len(samples), size):
            engine.push(s, samples[start : start + size])
        engine.close(s)
    while engine.has_unfinished():
        for event in engine.step().events:
            events[event.stream_id] += event.new_token_ids
    for language in ("auto", "de"):
        assert [events[f"{language}{i}"] for i in range(len(setup.audio))] == expected[language]
    with pytest.raises(OASRError, match="does not know language"):
        engine.open(StreamOptions(language="xx"))


def test_streams_that_join_and_leave_mid_run_each_get_what_they_get_alone(setup: Setup) -> None:
    alone = {}
    for i, samples in enumerate(setup.audio):
        alone[f"s{i}"] = tokens_of(run_streams(StreamingEngine(setup.loaded), {f"s{i}": samples}, seed=i)[f"s{i}"])
    # Three slots for three streams of 11, 3 and 5 s; the second joins late and leaves first, the third joins
    # after the first has run for a while.
    engine = StreamingEngine(setup.loaded, StreamingConfig(max_streams=3))
    events = run_streams(engine, {f"s{i}": a for i, a in enumerate(setup.audio)}, seed=7,
                         opens_at={"s0": 0, "s1": 9, "s2": 4})
    assert {s: tokens_of(e) for s, e in events.items()} == alone
    assert engine.scheduler.num_free_slots == 3 and not engine.has_unfinished()


def test_an_aborted_stream_frees_its_slot_and_leaves_nothing_behind(setup: Setup) -> None:
    engine = StreamingEngine(setup.loaded, StreamingConfig(max_streams=1))
    engine.open(stream_id="first")
    engine.push("first", setup.audio[0][: 16000 * 2])
    for _ in range(5):
        engine.step()
    assert engine.scheduler.streams["first"].num_chunks > 0
    with pytest.raises(StreamCapacityError, match="1 stream slots"):
        engine.open(stream_id="second")
    engine.abort("first")
    assert engine.scheduler.num_free_slots == 1 and not engine.has_unfinished()
    with pytest.raises(OASRError, match="no open stream"):
        engine.push("first", setup.audio[0][:160])
    # The slot's next stream starts from nothing: it decodes as it would on a fresh engine.
    events = run_streams(engine, {"second": setup.audio[1]}, seed=3)
    fresh = run_streams(StreamingEngine(setup.loaded), {"second": setup.audio[1]}, seed=3)
    assert tokens_of(events["second"]) == tokens_of(fresh["second"]) and tokens_of(fresh["second"])


def test_endpoints_end_utterances_and_restart_the_decoder(setup: Setup) -> None:
    # Only the maximum-length rule, so where endpoints fall does not depend on what the random model emits:
    # every 0.48 s (6 frames of 80 ms, 3 chunks of lookahead 1).
    rule = EndpointRule(must_contain_speech=False, min_trailing_silence_s=0.0, min_utterance_s=0.48,
                        name="max_utterance")
    options = StreamOptions(lookahead=1, endpointing=EndpointConfig(rules=(rule,)))
    events = run_streams(StreamingEngine(setup.loaded), {"s": setup.audio[1]}, seed=0, options=options)["s"]
    finals = [e for e in events if e.final]
    assert [e.endpoint for e in finals[:-1]] == ["max_utterance"] * (len(finals) - 1) and len(finals) > 5
    assert [e.utterance for e in finals] == list(range(len(finals)))
    assert all(f.end_s - f.start_s == pytest.approx(0.48) for f in finals[:-1])
    # Before its first endpoint a stream decodes as one without endpointing; after it, the decoder starts
    # afresh, so what follows differs from the unbroken stream's tokens.
    unbroken = tokens_of(run_streams(StreamingEngine(setup.loaded), {"s": setup.audio[1]}, seed=0,
                                     options=StreamOptions(lookahead=1))["s"])
    first = list(finals[0].token_ids)
    assert unbroken[: len(first)] == first
    assert [t for f in finals for t in f.token_ids] != unbroken


def test_streams_run_beside_whole_file_requests(setup: Setup) -> None:
    alone = ASREngine(setup.loaded)
    alone.add_request(setup.audio[2], DecodeOptions(), request_id="file")
    expected = None
    while alone.has_unfinished():
        expected = next((o.token_ids for o in alone.step() if o.finished), expected)
    assert expected
    engine = Engine(setup.loaded)
    engine.add_request(setup.audio[2], DecodeOptions(), request_id="file")
    engine.open_stream(StreamOptions(lookahead=1), stream_id="live")
    engine.streams.push("live", setup.audio[1])
    engine.streams.close("live")
    finished, events = [], []
    while engine.has_unfinished():
        result = engine.step()
        finished += [o for o in result.outputs if o.finished]
        events += result.events
    assert [o.token_ids for o in finished] == [expected]
    assert tokens_of(events) == reference_streamed(setup.reference, setup.features[1], 1)


def test_a_model_that_cannot_stream_is_refused_when_the_engine_is_built() -> None:
    loaded = oasr.from_pretrained("tiny.en", device="cpu", dtype="float32")
    with pytest.raises(StreamingUnsupportedError, match="cannot stream"):
        StreamingEngine(loaded)


def test_bad_stream_input_is_refused_and_the_stream_goes_on(setup: Setup) -> None:
    engine = StreamingEngine(setup.loaded)
    engine.open(stream_id="s")
    with pytest.raises(ValueError, match="1-D"):
        engine.push("s", np.zeros((2, 160), dtype=np.float32))
    with pytest.raises(ValueError, match="NaN"):
        engine.push("s", np.array([0.0, np.nan], dtype=np.float32))
    with pytest.raises(OASRError, match="already open"):
        engine.open(stream_id="s")
    engine.push("s", setup.audio[1])
    engine.close("s")
    with pytest.raises(ValueError, match="closed"):
        engine.push("s", setup.audio[1][:10])
    events = []
    while engine.has_unfinished():
        events += engine.step().events
    assert tokens_of(events) == reference_streamed(setup.reference, setup.features[1], 2)


def test_cli_stream_prints_transformers_streamed_tokens(setup: Setup, tmp_path: Path, capsys) -> None:
    import json

    import soundfile

    from oasr.cli import main

    files = []
    for i in (1, 2):
        files.append(tmp_path / f"clip{i}.wav")
        soundfile.write(files[-1], setup.audio[i], 16000, subtype="FLOAT")
    assert main(["transcribe", "--stream", "--chunk-ms", "160", "--model", str(setup.directory), "--device", "cpu",
                 "--dtype", "float32", "--output-format", "jsonl", *map(str, files)]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    expected = [reference_streamed(setup.reference, setup.features[i], 1) for i in (1, 2)]
    assert [row["token_ids"] for row in rows] == expected
    assert [row["file"] for row in rows] == [str(f) for f in files]
    assert [row["text"] for row in rows] == [setup.loaded.tokenizer.decode(e).strip() for e in expected]


def test_cli_stream_refuses_what_it_cannot_serve(setup: Setup, capsys) -> None:
    from oasr.cli import main

    assert main(["transcribe", "--stream", "--timestamps", "x.wav"]) == 2
    assert "--stream cannot be combined with --timestamps" in capsys.readouterr().err
    assert main(["transcribe", "--chunk-ms", "160", "x.wav"]) == 2
    assert "need --stream" in capsys.readouterr().err


@pytest.mark.gpu
def test_streams_on_cuda_give_the_cpu_reference_tokens(setup: Setup) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    loaded = oasr.from_pretrained(setup.directory, device="cuda", dtype="float32")
    expected = [reference_streamed(setup.reference, f, 1) for f in setup.features]
    events = run_streams(StreamingEngine(loaded), {f"s{i}": a for i, a in enumerate(setup.audio)}, seed=5,
                         options=StreamOptions(lookahead=1))
    assert [tokens_of(events[f"s{i}"]) for i in range(len(expected))] == expected


@pytest.mark.gpu
@pytest.mark.parametrize("which", ["nemotron", "nemotron3_5"])
def test_steps_replayed_as_cuda_graphs_give_the_eager_steps_tokens(setup: Setup, setup_3_5: Setup,
                                                                    which: str) -> None:
    """Streams joining at different steps (so steps run at several batch buckets), Nemotron 3.5's with a
    language prompt each: the graphed runtime's tokens equal the eager runtime's and the CPU reference's."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    chosen = setup if which == "nemotron" else setup_3_5
    loaded = oasr.from_pretrained(chosen.directory, device="cuda", dtype="float32")
    audio = {f"s{i}": a for i, a in enumerate(chosen.audio)}
    opens_at = {s: 3 * i for i, s in enumerate(audio)}
    options = StreamOptions(lookahead=1, language="de" if which == "nemotron3_5" else None)
    runs = {}
    for graphs in (False, True):
        engine = StreamingEngine(loaded, StreamingConfig(max_streams=4, cuda_graphs=graphs))
        runs[graphs] = {s: tokens_of(e) for s, e in run_streams(engine, audio, seed=7, opens_at=opens_at,
                                                                    options=options).items()}
        assert (engine.runtime._graphs is not None and len(engine.runtime._graphs) >= 3) == graphs
    assert runs[True] == runs[False]
    if which == "nemotron":
        assert [runs[True][s] for s in audio] == [reference_streamed(chosen.reference, f, 1)
                                                   for f in chosen.features]


def test_warm_up_leaves_no_trace_in_the_streams(setup: Setup) -> None:
    engine = StreamingEngine(setup.loaded, StreamingConfig(max_streams=3))
    engine.runtime.warm_up(1, 3)  # what a CUDA engine does when built: every bucket, through the scratch slot
    events = run_streams(engine, {"s": setup.audio[1]}, seed=2, options=StreamOptions(lookahead=1))
    assert tokens_of(events["s"]) == reference_streamed(setup.reference, setup.features[1], 1)
