"""NeMo ``.nemo`` archives through ``oasr transcribe``, against NeMo's own greedy tokens.

tests/data/nemo/ holds tiny archives built with nemo-toolkit's own classes and written with ``save_to``, the
16 kHz clips they were run on, and the tokens NeMo's ``transcribe()`` (and, for the cache-aware streaming one, its
streaming loop) gave: scripts/nemo_oracle/build_archives.py made them in a separate nemo venv
(scripts/setup_oracles.sh). CI does not run NeMo: these goldens are what it compares against.
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from oasr.cli import main

DATA = Path(__file__).parent / "data" / "nemo"
CLIPS = [str(DATA / f"clip{i}.flac") for i in range(3)]
ARCHITECTURES = {"ctc": "parakeet_ctc", "rnnt": "parakeet_rnnt", "tdt": "parakeet_tdt", "hybrid": "parakeet_rnnt",
                 "streaming": "nemotron_asr_streaming"}
# Canary needs its languages named (its archive's prompt_defaults name none), so it has tests of its own.
MULTITASK = {"canary": "canary"}


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # where the archive's tokenizer is written


def golden(name: str) -> dict:
    return json.loads((DATA / f"{name}.json").read_text())


def transcribe(model: str, capsys, *extra: str) -> list[dict]:
    assert main(["transcribe", *CLIPS, "--model", model, "--device", "cpu", "--dtype", "float32",
                 "--output-format", "jsonl", "--quiet", *extra]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_archive_gives_nemos_greedy_tokens_and_text(name: str, capsys) -> None:
    expected = golden(name)
    assert any(expected["tokens"])  # the oracle emitted something to compare
    rows = transcribe(str(DATA / f"{name}.nemo"), capsys)
    assert [row["token_ids"] for row in rows] == expected["tokens"]
    assert [row["text"] for row in rows] == [t.strip() for t in expected["texts"]]


def test_the_rnnt_golden_is_varied_enough_that_a_wrong_token_shows() -> None:
    # The archive was trained briefly on the clips (scripts/nemo_oracle/fit.py): a random prediction network and
    # joint repeat one token whatever the audio, which a decoder that ignored the encoder would also give.
    tokens = golden("rnnt")["tokens"]
    assert len({tuple(t) for t in tokens}) == len(tokens) and all(len(set(t)) >= 3 for t in tokens)


def test_archive_maps_to_the_architecture() -> None:
    from oasr.models.loader import read_checkpoint, resolve_source

    for name, architecture in {**ARCHITECTURES, **MULTITASK}.items():
        checkpoint = read_checkpoint(resolve_source(DATA / f"{name}.nemo"))
        assert checkpoint.architecture == architecture and checkpoint.format == "nemo"
        assert all(k.startswith("preprocessor.") or k.startswith("ctc_decoder.") for k in checkpoint.dropped_keys)
    hybrid = read_checkpoint(resolve_source(DATA / "hybrid.nemo"))
    assert any(k.startswith("ctc_decoder.") for k in hybrid.dropped_keys)  # its CTC head is not run


def _prompt_flags(prompt: dict) -> list[str]:
    """NeMo's transcribe() prompt (source_lang, target_lang, pnc) as oasr transcribe's flags."""
    flags = ["--language", prompt["source_lang"], "--target-language", prompt["target_lang"]]
    return flags + ([] if prompt["pnc"] == "yes" else ["--no-punctuation"])


@pytest.mark.parametrize("index", [0, 1], ids=["transcribe", "translate"])
def test_canary_archive_gives_nemos_greedy_tokens_for_each_prompt(index: int, capsys) -> None:
    expected = golden("canary")["prompts"][index]
    assert len({tuple(t) for t in expected["tokens"]}) == len(expected["tokens"])  # each clip says something else
    rows = transcribe(str(DATA / "canary.nemo"), capsys, *_prompt_flags(expected["prompt"]))
    assert [row["token_ids"] for row in rows] == expected["tokens"]
    assert [row["text"] for row in rows] == [t.strip() for t in expected["texts"]]


def test_canary_prompt_is_the_one_nemo_builds() -> None:
    """canary2 prompts as NeMo encodes them: one SentencePiece call, so the model's dummy prefix '▁' leads."""
    from oasr.models import ARCHITECTURES as REGISTRY
    from oasr.models.loader import build_model, read_checkpoint, resolve_source
    from oasr.tokenizers.sentencepiece import SentencePieceTokenizer
    from oasr.types import DecodeOptions

    checkpoint = read_checkpoint(resolve_source(DATA / "canary.nemo"))
    config, _ = build_model(checkpoint)
    prompter = REGISTRY.get("canary").prompt_builder(config, SentencePieceTokenizer(checkpoint.tokenizer_file), "canary")
    for expected in golden("canary")["prompts"]:
        options = DecodeOptions(language=expected["prompt"]["source_lang"],
                                target_language=expected["prompt"]["target_lang"])
        assert list(prompter.prompt_ids(options)) == expected["prompt_ids"]


def test_streaming_archive_streams_nemos_cache_aware_tokens(capsys) -> None:
    rows = transcribe(str(DATA / "streaming.nemo"), capsys, "--stream")
    assert [row["token_ids"] for row in rows] == golden("streaming")["streamed_tokens"]


def test_convert_round_trip_gives_the_same_tokens(tmp_path: Path, capsys) -> None:
    out = tmp_path / "native"
    assert main(["convert", str(DATA / "tdt.nemo"), str(out)]) == 0
    capsys.readouterr()
    assert (out / "tokenizer.model").is_file()
    assert [row["token_ids"] for row in transcribe(str(out), capsys)] == golden("tdt")["tokens"]


def test_directory_with_one_archive_loads_it_and_with_two_is_refused(tmp_path: Path, capsys) -> None:
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "model.nemo").write_bytes((DATA / "ctc.nemo").read_bytes())
    assert [row["token_ids"] for row in transcribe(str(tmp_path / "one"), capsys)] == golden("ctc")["tokens"]
    (tmp_path / "one" / "other.nemo").write_bytes(b"x")
    assert main(["transcribe", CLIPS[0], "--model", str(tmp_path / "one"), "--device", "cpu"]) != 0
    err = capsys.readouterr().err
    assert "several .nemo archives" in err and "model.nemo" in err and "other.nemo" in err


def _rewrite(source: Path, destination: Path, *, drop: str | None = None, edit=None) -> Path:
    """A copy of ``source`` without the member ending in ``drop``, its config passed through ``edit``."""
    with tarfile.open(source) as src, tarfile.open(destination, "w") as dst:
        for member in src.getmembers():
            if drop is not None and member.name.endswith(drop):
                continue
            data = src.extractfile(member).read() if member.isfile() else None
            if data is not None and member.name.endswith("model_config.yaml") and edit is not None:
                data = edit(data.decode()).encode()
                member.size = len(data)
            dst.addfile(member, io.BytesIO(data) if data is not None else None)
    return destination


@pytest.mark.parametrize(("make", "message"), [
    (lambda d: (d / "bad.nemo").write_bytes(b"not a tar") and d / "bad.nemo", "not a readable .nemo archive"),
    (lambda d: _rewrite(DATA / "ctc.nemo", d / "x.nemo", drop="model_weights.ckpt"), "no model_weights.ckpt"),
    (lambda d: _rewrite(DATA / "ctc.nemo", d / "x.nemo", edit=lambda t: t.replace("subsampling: dw_striding",
                                                                                   "subsampling: striding")),
     "encoder.subsampling='striding' is not supported"),
    (lambda d: _rewrite(DATA / "ctc.nemo", d / "x.nemo", edit=lambda t: t.replace("self_attention_model: rel_pos",
                                                                                   "self_attention_model: abs_pos")),
     "encoder.self_attention_model='abs_pos' is not supported"),
    (lambda d: _rewrite(DATA / "ctc.nemo", d / "x.nemo", edit=lambda t: t.replace("normalize: per_feature",
                                                                                   "normalize: all_features")),
     "preprocessor.normalize='all_features' is not supported"),
])
def test_bad_archive_is_refused_naming_the_member_or_field(make, message, tmp_path: Path, capsys) -> None:
    archive = make(tmp_path)
    assert main(["transcribe", CLIPS[0], "--model", str(archive), "--device", "cpu"]) != 0
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize(("edit", "message"), [
    (lambda t: t.replace("prompt_format: canary2", "prompt_format: canary"), "prompt_format='canary' is not supported"),
    (lambda t: t.replace("type: bpe", "type: agg"), "tokenizer.type='agg' is not supported"),
    (lambda t: t.replace("pre_ln: true", "pre_ln: false"), "transf_decoder.config_dict.pre_ln=False is not supported"),
])
def test_canary_archive_other_than_canary_1b_v2_is_refused_naming_the_field(edit, message, tmp_path: Path,
                                                                            capsys) -> None:
    archive = _rewrite(DATA / "canary.nemo", tmp_path / "x.nemo", edit=edit)
    assert main(["transcribe", CLIPS[0], "--model", str(archive), "--device", "cpu", "--language", "en"]) != 0
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_archive_declares_nemos_stream_tail_and_a_transformers_config_keeps_padding() -> None:
    from oasr.models.loader import build_model, read_checkpoint, resolve_source
    from oasr.models.nemotron_streaming.config import NemotronAsrStreamingConfig

    config, _ = build_model(read_checkpoint(resolve_source(DATA / "streaming.nemo")))
    assert config.encoder_config.stream_tail == "mask"
    assert NemotronAsrStreamingConfig.from_dict({}).encoder_config.stream_tail == "pad"  # transformers' config.json


# The streaming archive's chunks as NeMo's loop cut them (measured with scripts/nemo_oracle/streaming.py's loop,
# printing each conformer_stream_step's processed_signal_length and encoded length): subsampling 8, lookahead 2,
# a first chunk of 17 feature frames and later ones of 24. (first chunk, real feature frames here) -> encoder frames.
NEMO_TAIL_FRAMES = {(True, 16): 3, (False, 23): 3,
                    (False, 13): 2,  # clip0: 150 real frames, NeMo's buffer 151, its last chunk 14 -> 2
                    (False, 7): 1,  # clip1 and clip2: 240 and 360 real frames, the last chunk 8 -> 1
                    (False, 5): 0,  # 6 buffered frames, fewer than the subsampling: NeMo drops the chunk
                    (True, 1): 2}  # calc_length of 2 frames through three causal stride-2 convolutions


@pytest.mark.parametrize(("first", "num_features"), list(NEMO_TAIL_FRAMES))
def test_mask_tail_decodes_the_encoder_frames_nemos_loop_decodes(first: bool, num_features: int) -> None:
    from oasr.streaming.geometry import StreamGeometry

    shape = dict(lookahead=2, chunk_frames=3, first_feature_frames=17, feature_frames=24, past_frames=6,
                 visible_past_frames=6, frame_seconds=0.08)
    assert StreamGeometry(**shape, tail="mask").tail_frames(first, num_features) == NEMO_TAIL_FRAMES[first,
                                                                                                      num_features]
    assert StreamGeometry(**shape).tail_frames(first, num_features) == 3  # "pad": the whole chunk
    with pytest.raises(ValueError, match="tail rule"):
        StreamGeometry(**shape, tail="drop")
