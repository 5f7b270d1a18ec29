"""FunASR's Paraformer through ``oasr transcribe``, against FunASR's own outputs.

tests/data/funasr/paraformer/ is a tiny random Paraformer built with funasr's own classes and saved in FunASR's
folder layout (config.yaml, model.pt, am.mvn, tokens.json); paraformer.json holds what funasr 1.4.16's
``AutoModel(model=DIR).generate`` gave on three shared speech clips (token ids, text, word timestamps) and the
per-token CIF timestamps. scripts/funasr_oracle/build_models.py made them in a separate venv
(scripts/setup_oracles.sh); CI never runs FunASR and only reads these files.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from oasr.cli import main
from tests.speech_data import audio_path, require_speech_data

DATA = Path(__file__).parent / "data" / "funasr"
MODEL = DATA / "paraformer"


def golden() -> dict:
    return json.loads((DATA / "paraformer.json").read_text(encoding="utf-8"))


def clip_paths() -> list[str]:
    by_id = {e["id"]: e for e in require_speech_data()}
    return [str(audio_path(by_id[name])) for name in golden()["clips"]]


def transcribe(capsys, model: Path = MODEL, *extra: str) -> list[dict]:
    assert main(["transcribe", *clip_paths(), "--model", str(model), "--device", "cpu", "--dtype", "float32",
                 "--output-format", "jsonl", "--quiet", *extra]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]


def test_paraformer_gives_funasrs_tokens_and_text(capsys) -> None:
    expected = golden()
    assert all(len(ids) > 5 for ids in expected["token_ids"])  # the oracle emitted something to compare
    rows = transcribe(capsys)
    assert [row["token_ids"] for row in rows] == expected["token_ids"]
    assert [row["text"] for row in rows] == expected["texts"]


def test_paraformer_word_timestamps_are_funasrs_cif_timestamps(capsys) -> None:
    expected = golden()
    rows = transcribe(capsys, MODEL, "--word-timestamps")
    for row, spans, text in zip(rows, expected["word_timestamps"], expected["timestamp_texts"], strict=True):
        words = [w for segment in row["segments"] for w in segment["words"]]
        assert [w["word"] for w in words] == text.split(" ")
        assert [[round(w["start"] * 1000), round(w["end"] * 1000)] for w in words] == spans


def test_token_timestamps_equal_funasrs_before_words_are_formed() -> None:
    from oasr.models.loader import from_pretrained
    from oasr.models.paraformer.timestamps import token_spans
    from tests.speech_data import clips

    expected = golden()
    loaded = from_pretrained(MODEL, device="cpu", dtype="float32")
    audio = [clip.audio for clip in clips(expected["clips"])]
    features, lengths = loaded.features(audio)
    with torch.inference_mode():
        encoded = loaded.model.encode(features, lengths)
        cif = loaded.model.predict(encoded.hidden, encoded.lengths)
    for i, ids in enumerate(expected["token_ids"]):
        span = int(lengths[i]) + 1
        got = token_spans(cif.fires[i, :span], cif.alphas[i, :span], loaded.tokenizer.tokens(ids))
        assert got == expected["token_timestamps"][i]


def test_srt_holds_funasrs_text(tmp_path: Path) -> None:
    clip = clip_paths()[1]
    assert main(["transcribe", clip, "--model", str(MODEL), "--device", "cpu", "--dtype", "float32",
                 "--output-format", "srt", "--word-timestamps", "--output-dir", str(tmp_path), "--quiet"]) == 0
    cues = next(tmp_path.glob("*.srt")).read_text(encoding="utf-8").strip().split("\n")
    assert cues[0] == "1" and cues[1].startswith("00:00:00,000 --> ")
    assert cues[2] == golden()["texts"][1]


def test_the_folder_maps_to_paraformer_with_nothing_dropped() -> None:
    from oasr.models.loader import read_checkpoint, resolve_source

    checkpoint = read_checkpoint(resolve_source(MODEL))
    assert checkpoint.architecture == "paraformer" and checkpoint.format == "funasr"
    assert len(checkpoint.config["frontend_conf"]["cmvn_shift"]) == 560


def _copy(tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    shutil.copytree(MODEL, folder)
    return folder


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: (d / "config.yaml").write_text((d / "config.yaml").read_text().replace(
        "model: Paraformer", "model: BiCifParaformer")), "field model is 'BiCifParaformer'"),
    (lambda d: (d / "config.yaml").write_text((d / "config.yaml").read_text().replace(
        "predictor: CifPredictorV2", "predictor: CifPredictorV3")), "field predictor is 'CifPredictorV3'"),
    (lambda d: (d / "config.yaml").write_text((d / "config.yaml").read_text().replace(
        "input_layer: pe", "input_layer: conv2d")), "field encoder_conf.input_layer is 'conv2d'; OASR serves 'pe'"),
    (lambda d: (d / "tokens.json").unlink(), "no token list"),
    (lambda d: (d / "tokens.json").write_text('["<blank>", "<s>"]'), "tokens.json holds 2"),
    (lambda d: (d / "am.mvn").write_text("<Nnet>\n<AddShift> 560 560\n<LearnRateCoef> 0 [ 1 2 ]\n</Nnet>\n"),
     "am.mvn has no <Rescale>"),
    (lambda d: (d / "model.pt").write_bytes(b"not a pickle"), "model.pt is not a torch state dict"),
])
def test_a_folder_oasr_cannot_serve_is_refused_naming_the_field(edit, message, tmp_path: Path, capsys) -> None:
    folder = _copy(tmp_path)
    edit(folder)
    assert main(["transcribe", clip_paths()[0], "--model", str(folder), "--device", "cpu", "--quiet"]) != 0
    assert message in capsys.readouterr().err


def test_inputs_too_short_for_a_frame_give_no_tokens_and_no_error(tmp_path: Path, capsys) -> None:
    import numpy as np
    import soundfile as sf

    paths = []
    for name, samples in (("10ms", 160), ("silence", 16_000)):
        audio = np.random.default_rng(0).normal(0, 0.1, samples) if name == "10ms" else np.zeros(samples)
        sf.write(tmp_path / f"{name}.wav", audio.astype(np.float32), 16_000)
        paths.append(str(tmp_path / f"{name}.wav"))
    for batch in ([paths[0]], paths):  # a batch with no frames at all, and one with a longer row
        assert main(["transcribe", *batch, "--model", str(MODEL), "--device", "cpu", "--output-format", "jsonl",
                     "--quiet", "--word-timestamps"]) == 0
        rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]
        assert rows[0]["token_ids"] == [] and rows[0]["error"] is None
