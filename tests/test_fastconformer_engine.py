"""Parakeet checkpoints served through the same engine, API and CLI as Whisper (frame-synchronous families)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import oasr
from oasr.audio import load_audio
from oasr.cli import main
from oasr.decode import DECODE_STRATEGIES
from oasr.models.capabilities import capabilities_of
from oasr.errors import UnsupportedOptionError
from oasr.models.loader import from_pretrained
from parakeet_reference import build_reference, write_tokenizer

JFK = Path(oasr.__file__).parent / "assets" / "jfk.flac"
KINDS = ("ctc", "rnnt", "tdt")


@pytest.fixture(scope="module", params=KINDS)
def model_dir(request, tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp(f"engine_parakeet_{request.param}")
    build_reference(request.param).save_pretrained(directory)
    write_tokenizer(directory / "tokenizer.json", "<pad>" if request.param == "ctc" else "<blank>")
    return directory


def direct_decode(loaded, audio) -> list[list[int]]:
    """The strategy run by hand on the extractor's batch: what the engine must reproduce."""
    features, lengths = loaded.features(audio)
    strategy = DECODE_STRATEGIES.get(capabilities_of(type(loaded.model)).default_strategy)()
    with torch.inference_mode():
        return strategy.decode(loaded.model, loaded.model.encode(features, lengths))


def test_engine_results_equal_direct_decoding_for_a_batch_of_different_lengths(model_dir: Path) -> None:
    loaded = from_pretrained(model_dir, device="cpu", dtype="float32")
    full = load_audio(JFK)
    audio = [full, full[: 16000 * 3], full[16000 * 2 : 16000 * 7]]
    expected = direct_decode(loaded, audio)
    assert any(expected), "the random model emits nothing: the comparison could not fail"
    results = oasr.transcribe(audio, loaded, batch_size=2)
    assert [r.token_ids for r in results] == expected
    assert [r.text for r in results] == [loaded.tokenizer.decode(ids).strip() for ids in expected]


def test_cli_transcribes_from_the_directory(model_dir: Path, capsys) -> None:
    assert main(["transcribe", str(JFK), "--model", str(model_dir), "--device", "cpu", "--output-format", "jsonl"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["file"] == str(JFK) and row["duration_s"] == 11.0 and row["language"] is None


def test_options_the_model_cannot_serve_are_refused(model_dir: Path) -> None:
    loaded = from_pretrained(model_dir, device="cpu", dtype="float32")
    with pytest.raises(UnsupportedOptionError, match="language"):
        oasr.transcribe(JFK, loaded, language="en")
    with pytest.raises(UnsupportedOptionError, match="translate"):
        oasr.transcribe(JFK, loaded, task="translate")
    with pytest.raises(UnsupportedOptionError, match="word timestamps"):
        oasr.transcribe(JFK, loaded, word_timestamps=True)


def test_offline_feeding_encodes_similar_lengths_together(model_dir: Path) -> None:
    """engine.run reads ahead and submits the longest first, so each encode batch pads little; each request's
    result is still its own."""
    from oasr.engine.config import EngineConfig, SchedulerConfig
    from oasr.engine.engine import ASREngine
    from oasr.types import DecodeOptions

    loaded = from_pretrained(model_dir, device="cpu", dtype="float32")
    full = load_audio(JFK)
    seconds = [3, 9, 1, 7, 2, 10]
    audio = {f"r{i}": full[: 16000 * s] for i, s in enumerate(seconds)}
    engine = ASREngine(loaded, EngineConfig(scheduler=SchedulerConfig(max_encode_rows=2)))
    batches = []
    execute = engine.runner.execute

    def recording_execute(out, requests):
        batches.append(sorted(len(requests[row.request_id].audio) // 16000 for row in out.encode))
        return execute(out, requests)

    engine.runner.execute = recording_execute
    results = {o.request_id: o.token_ids for o in engine.run((k, a, DecodeOptions()) for k, a in audio.items())}
    assert batches == [[9, 10], [3, 7], [1, 2]]
    expected = direct_decode(loaded, list(audio.values()))
    assert [results[k] for k in audio] == expected
