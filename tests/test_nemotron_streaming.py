"""Nemotron ASR streaming (``NemotronAsrStreamingForRNNT``) served whole-file, against transformers' own classes:
a tiny random checkpoint saved with ``save_pretrained``, loaded through ``oasr.from_pretrained``; on CPU fp32 the
features and encoder output must equal the reference's for a batch of different lengths, and the engine's greedy
tokens must equal transformers' offline ``generate``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import oasr
from oasr.cli import main
from oasr.models import ARCHITECTURES
from oasr.models.capabilities import capabilities_of
from oasr.models.converters.native import save_native
from oasr.models.loader import read_checkpoint, resolve_source
from oasr.models.nemotron_streaming.encoder import ChunkedLimitedWindow
from nemotron_reference import (
    JFK,
    Pair,
    build_reference,
    clips,
    feature_extractor,
    make_pair,
    reference_features,
    reference_greedy,
    save,
)
from parakeet_reference import attention_mask

TOLERANCE = 1e-4



@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> Pair:
    return make_pair(build_reference(), tmp_path_factory.mktemp("nemotron_streaming"))


def test_checkpoint_loads_key_for_key(pair: Pair) -> None:
    assert pair.loaded.architecture == "nemotron_asr_streaming" and pair.loaded.format == "huggingface"
    ours, theirs = pair.loaded.model.state_dict(), pair.reference.state_dict()
    assert set(ours) == set(theirs)
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)


def test_native_round_trip_keeps_the_config_and_the_encoder_output(pair: Pair, tmp_path: Path) -> None:
    native = oasr.from_pretrained(save_native(read_checkpoint(resolve_source(pair.directory)), tmp_path),
                                  device="cpu", dtype="float32")
    assert native.format == "native" and native.config == pair.loaded.config
    assert native.config.encoder_config.sliding_window == 7  # the streaming fields survive
    with torch.inference_mode():
        ours = native.model.encode(pair.x.transpose(1, 2), pair.lengths).hidden
        expected = pair.loaded.model.encode(pair.x.transpose(1, 2), pair.lengths).hidden
    assert torch.equal(ours, expected)


def test_capabilities_are_whole_file_transducer_greedy() -> None:
    record = capabilities_of(ARCHITECTURES.get("nemotron_asr_streaming"))
    assert record.runner == "frame_sync" and record.decode_strategies == ("transducer_greedy",)
    assert record.streaming == "cache_aware"


def test_features_equal_the_reference_extractor_unnormalised(pair: Pair) -> None:
    ours, lengths = pair.loaded.features(clips())
    assert torch.equal(lengths, pair.lengths)
    assert ours.shape == pair.x.transpose(1, 2).shape
    torch.testing.assert_close(ours.transpose(1, 2), pair.x, rtol=0, atol=TOLERANCE)


def test_chunked_limited_window_sees_its_chunk_and_whole_chunks_behind() -> None:
    # Chunks of 2 frames (lookahead 1); 5 frames of left context round down to 2 whole chunks.
    window = ChunkedLimitedWindow(left_context=5, right_context=1)(7, torch.device("cpu"))
    expected = torch.tensor([
        [1, 1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 1, 1, 0],
        [1, 1, 1, 1, 1, 1, 0],
        [0, 0, 1, 1, 1, 1, 1],
    ], dtype=torch.bool)  # fmt: skip
    assert torch.equal(window, expected)


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "padded"])
def test_encoder_output_matches_the_reference_for_a_batch_of_different_lengths(
    pair: Pair, packed: bool, monkeypatch
) -> None:
    encoder = pair.reference.config.encoder_config
    assert int(pair.lengths.max()) // encoder.subsampling_factor > encoder.sliding_window  # the window limits
    with torch.no_grad():
        theirs = pair.reference.encoder(input_features=pair.x, attention_mask=attention_mask(pair.lengths))
    ours_encoder = pair.loaded.model.encoder
    monkeypatch.setattr(ours_encoder, "pack_from_padding", 0.0 if packed else 2.0)
    real = theirs.attention_mask.bool()
    assert ours_encoder.layout(pair.lengths.tolist(), real.sum(-1), real.shape[1]).is_packed == packed
    with torch.inference_mode():
        ours = pair.loaded.model.encode(pair.x.transpose(1, 2), pair.lengths)
    assert torch.equal(ours.lengths, real.sum(-1).long())
    torch.testing.assert_close(ours.hidden[real], theirs.last_hidden_state[real], rtol=0, atol=TOLERANCE)


def test_encoder_matches_the_reference_with_the_released_window(tmp_path: Path) -> None:
    """The released checkpoints' window: chunks of 14 frames, 70 frames of left context (5 whole chunks), which
    the 11 s clip's 139 frames outrun."""
    reference = build_reference(sliding_window=71, default_num_lookahead_tokens=13)
    loaded = oasr.from_pretrained(save(reference, tmp_path), device="cpu", dtype="float32")
    x, lengths = reference_features(feature_extractor(reference.config.encoder_config.num_mel_bins), clips())
    with torch.no_grad():
        theirs = reference.encoder(input_features=x, attention_mask=attention_mask(lengths))
    with torch.inference_mode():
        ours = loaded.model.encode(x.transpose(1, 2), lengths)
    real = theirs.attention_mask.bool()
    assert int(real.sum(-1).max()) > 6 * 14
    torch.testing.assert_close(ours.hidden[real], theirs.last_hidden_state[real], rtol=0, atol=TOLERANCE)


def test_engine_tokens_equal_the_reference_offline_generate(pair: Pair) -> None:
    expected = reference_greedy(pair.reference, pair.x, pair.lengths)
    # The comparison could fail: rows differ, each mixes tokens, and most frames emit a blank soon.
    assert len({tuple(row) for row in expected}) == len(expected)
    assert all(len(set(row)) >= 5 for row in expected)
    frames = pair.reference.get_audio_features(
        input_features=pair.x, attention_mask=attention_mask(pair.lengths)).attention_mask.sum(-1)
    assert all(len(row) < 2 * int(n) for row, n in zip(expected, frames, strict=True))
    results = oasr.transcribe(clips(), pair.loaded, batch_size=2)
    assert [r.token_ids for r in results] == expected
    assert [r.text for r in results] == [pair.loaded.tokenizer.decode(ids).strip() for ids in expected]


def test_cli_transcribes_a_file_from_the_checkpoint_directory(pair: Pair, capsys) -> None:
    expected = reference_greedy(pair.reference, pair.x[:1], pair.lengths[:1])[0]
    assert main(["transcribe", str(JFK), "--model", str(pair.directory), "--device", "cpu",
                 "--output-format", "jsonl"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["file"] == str(JFK) and row["text"] == pair.loaded.tokenizer.decode(expected).strip()
