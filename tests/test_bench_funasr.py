"""The FunASR bench (oasr.bench.funasr) at tiny shapes on the CPU with ``--peer none`` (CI has no funasr), and
the FunASR folders it writes without funasr."""

from __future__ import annotations

import json

import pytest
import sentencepiece as spm
import yaml

from oasr.bench import funasr as bench
from oasr.bench.funasr_models import (FUNASR_SHAPES, SENSE_VOICE_BPE, SENSE_VOICE_TAGS, funasr_config,
                                      write_funasr_folder)
from oasr.models.loader import from_pretrained


def test_the_release_configs_have_the_published_sizes() -> None:
    paraformer = funasr_config(FUNASR_SHAPES["paraformer-large"])
    assert paraformer["encoder_conf"]["num_blocks"] == 50 and paraformer["encoder_conf"]["output_size"] == 512
    assert paraformer["decoder_conf"]["num_blocks"] == paraformer["decoder_conf"]["att_layer_num"] == 16
    sense_voice = funasr_config(FUNASR_SHAPES["sense-voice-small"])
    assert sense_voice["encoder_conf"]["tp_blocks"] == 20 and sense_voice["input_size"] == 560
    assert FUNASR_SHAPES["sense-voice-small"].vocab_size == 25055


@pytest.mark.parametrize("arch", ["paraformer-tiny", "sense-voice-tiny"])
def test_a_written_folder_loads_in_oasr_whole(arch, tmp_path) -> None:
    folder = write_funasr_folder(arch, tmp_path / arch)
    config = yaml.safe_load((folder / "config.yaml").read_text())
    assert config["model"] == FUNASR_SHAPES[arch].model
    loaded = from_pretrained(folder, device="cpu", dtype="float32")
    assert loaded.format == "funasr"
    if arch.startswith("sense"):
        bpe = spm.SentencePieceProcessor(model_file=str(folder / SENSE_VOICE_BPE))
        assert bpe.get_piece_size() == FUNASR_SHAPES[arch].vocab_size
        assert all(bpe.piece_to_id(tag) != bpe.unk_id() for tag in SENSE_VOICE_TAGS)
        assert set(loaded.config.tag_token_ids) == set(SENSE_VOICE_TAGS)


def test_texts_compare_without_tags_and_spacing() -> None:
    assert bench.comparable("<|en|><|HAPPY|> 上 上a b") == bench.comparable("上上 ab") == "上上ab"


def test_the_bench_runs_oasr_alone_with_peer_none(capsys) -> None:
    results = bench.main(["--arch", "paraformer-tiny", "sense-voice-tiny", "--num-utterances", "3", "--device",
                          "cpu", "--peer", "none", "--rounds", "1", "--max-encode-rows", "1", "3"])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert lines == results and [r["arch"] for r in results] == ["paraformer-tiny", "sense-voice-tiny"]
    for result in results:
        assert result["utterances"] == 3 and result["audio_seconds"] > 6
        assert result["oasr"]["seconds"] > 0 and result["oasr"]["tokens_per_clip"] > 1
        rounds = result["oasr"]["rounds"]  # each batch size timed; the best of all is the one reported
        assert sorted(rounds) == ["1", "3"] and result["oasr"]["seconds"] == min(min(r) for r in rounds.values())
        assert result["oasr"]["seconds"] in rounds[str(result["oasr"]["max_encode_rows"])]
        assert result["funasr"] == {"skipped": "--peer none"}
