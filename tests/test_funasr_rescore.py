"""FunASR's Conformer and attention rescoring, against FunASR's own scores.

tests/data/funasr/conformer/ is a tiny random FunASR ``Conformer`` (CTC head and Transformer decoder) built with
funasr's own classes; conformer.json holds, for three shared clips, a fixed n-best of hypotheses and the score
FunASR's decoder gives each (the sum its beam search accumulates through ``TransformerDecoder.score``, ``</s>``
included), each one's CTC log-likelihood and the CTC greedy labels. scripts/funasr_oracle/build_conformer.py made
them; CI never runs FunASR. OASR computes everything here from the audio: its fbank, encoder, CTC head, decoder.
"""

from __future__ import annotations

import json
import shutil
from functools import cache
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml

from oasr.cli import main
from oasr.decode.attention_rescoring import RescoreOptions, combined_scores, prefix_beam_nbest, rescore_nbest
from oasr.decode.base import EncoderOutput
from oasr.decode.ctc_prefix_beam import prefix_beam_search
from oasr.types import DecodeOptions
from tests.speech_data import audio_path, require_speech_data

DATA = Path(__file__).parent / "data" / "funasr"
MODEL = DATA / "conformer"
TOLERANCE = 1e-4  # on sums of up to ~120 float32 log-probabilities


@cache
def golden() -> dict:
    return json.loads((DATA / "conformer.json").read_text(encoding="utf-8"))


def clip_paths() -> list[str]:
    by_id = {e["id"]: e for e in require_speech_data()}
    return [str(audio_path(by_id[name])) for name in golden()["clips"]]


@cache
def loaded():
    from oasr.models.loader import from_pretrained

    return from_pretrained(str(MODEL), device="cpu", dtype="float32")


def encode(paths: list[str]) -> EncoderOutput:
    """The clips as one padded batch through OASR's frontend and encoder."""
    import soundfile as sf

    model = loaded()
    audio = [torch.from_numpy(sf.read(p, dtype="float32")[0]) for p in paths]
    features, _ = model.features(audio, device=torch.device("cpu"))
    lengths = model.features.frame_lengths(torch.tensor([len(a) for a in audio]))
    with torch.no_grad():
        return model.model.encode(features, lengths)


@cache
def encoded_batch() -> EncoderOutput:
    return encode(clip_paths())


@cache
def encoded_alone() -> tuple[EncoderOutput, ...]:
    return tuple(encode([path]) for path in clip_paths())


def results() -> list[dict]:
    return [golden()["results"][name] for name in golden()["clips"]]


def ctc_log_likelihood(log_probs: torch.Tensor, length: int, hypothesis: list[int]) -> float:
    """log_probs: [T, V] of one row -> the hypothesis's CTC log-likelihood (torch's CTC, not OASR's search)."""
    return -float(F.ctc_loss(log_probs[:length, None], torch.tensor([hypothesis], dtype=torch.long),
                             torch.tensor([length]), torch.tensor([len(hypothesis)]), reduction="sum"))


@pytest.mark.parametrize("index", range(3))
def test_decoder_scores_equal_funasrs_for_each_hypothesis(index: int) -> None:
    result, encoded = results()[index], encoded_alone()[index]
    assert int(encoded.lengths[0]) == result["num_encoder_frames"]
    with torch.no_grad():
        scores = loaded().model.rescore(encoded, [result["hypotheses"]])
    assert scores.shape == (1, len(result["hypotheses"]))
    np.testing.assert_allclose(scores[0].numpy(), result["decoder_scores"], atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("index", range(3))
def test_ctc_head_gives_funasrs_log_likelihoods_and_greedy_labels(index: int) -> None:
    result, encoded = results()[index], encoded_alone()[index]
    with torch.no_grad():
        log_probs = loaded().model.ctc_log_probs(encoded.hidden)[0]
    length = int(encoded.lengths[0])
    ours = [ctc_log_likelihood(log_probs, length, h) for h in result["hypotheses"]]
    np.testing.assert_allclose(ours, result["ctc_scores"], atol=TOLERANCE, rtol=0)
    labels = torch.unique_consecutive(log_probs[:length].argmax(-1))
    assert labels[labels != 0].tolist() == result["ctc_greedy"]


def test_a_padded_batch_scores_each_row_as_funasr_scores_it_alone() -> None:
    """The legacy position term, the convolution module and the frame counts are laid out per row."""
    batch = encoded_batch()
    assert batch.lengths.tolist() == [r["num_encoder_frames"] for r in results()]
    hypotheses = [r["hypotheses"] for r in results()]
    with torch.no_grad():
        scores = loaded().model.rescore(batch, hypotheses)
    np.testing.assert_allclose(scores.numpy(), np.array([r["decoder_scores"] for r in results()]), atol=TOLERANCE,
                               rtol=0)


def test_the_goldens_rank_differently_by_decoder_and_by_ctc() -> None:
    """Otherwise no weight could change the winner and the rescoring tests below could not fail."""
    assert any(np.argmax(r["decoder_scores"]) != np.argmax(r["ctc_scores"]) for r in results())


@pytest.mark.parametrize("weight", [0.0, 0.3, 0.5, 1.0])
def test_combined_score_of_the_goldens_picks_their_weighted_argmax(weight: float) -> None:
    for result in results():
        ctc, attention = torch.tensor([result["ctc_scores"]]), torch.tensor([result["decoder_scores"]])
        expected = np.argmax(weight * np.array(result["decoder_scores"]) + (1 - weight) * np.array(result["ctc_scores"]))
        assert int(combined_scores(ctc, attention, weight).argmax()) == expected


def test_a_dead_beam_never_wins_even_on_the_decoder_alone() -> None:
    ctc = torch.tensor([[-5.0, float("-inf")]])
    assert combined_scores(ctc, torch.tensor([[-9.0, -1.0]]), 1.0).argmax().item() == 0


@cache
def first_pass() -> tuple[list[list[list[int]]], torch.Tensor, torch.Tensor]:
    """The batch's 4-best, their CTC scores and their decoder scores [B, 4], computed apart from rescore_nbest."""
    batch, model = encoded_batch(), loaded().model
    with torch.no_grad():
        nbest, ctc = prefix_beam_nbest(model.ctc_log_probs(batch.hidden), batch.lengths, model.blank_id, 4)
        return nbest, ctc, model.rescore(batch, nbest)


@pytest.mark.parametrize("weight", [0.0, 0.5, 1.0])
def test_rescored_best_is_the_argmax_of_the_combined_score(weight: float) -> None:
    nbest, ctc, attention = first_pass()
    assert [len(row) for row in nbest] == [4, 4, 4] and torch.isfinite(ctc).all()
    with torch.no_grad():
        best, nbest_again, scores = rescore_nbest(loaded().model, encoded_batch(), RescoreOptions(4, weight))
    assert nbest_again == nbest
    combined = weight * attention.numpy() + (1 - weight) * ctc.numpy()
    np.testing.assert_allclose(scores.numpy(), combined, atol=TOLERANCE, rtol=0)
    assert best == [row[k] for row, k in zip(nbest, combined.argmax(axis=1), strict=True)]
    if weight == 0.0:  # the CTC ranking alone is the prefix beam search's own answer
        model, batch = loaded().model, encoded_batch()
        with torch.no_grad():
            log_probs = model.ctc_log_probs(batch.hidden)
        assert best == prefix_beam_search(log_probs, batch.lengths, model.blank_id, 4)[0]


def test_rescoring_changes_the_answer_on_some_clip() -> None:
    """Decoder and CTC disagree on some clip's 4-best, so the weight decides (the test above could fail)."""
    _, ctc, attention = first_pass()
    assert (ctc.argmax(dim=1) != attention.argmax(dim=1)).any()


def transcribe_ids(capsys, *flags: str) -> list[list[int]]:
    assert main(["transcribe", *clip_paths(), "--model", str(MODEL), "--device", "cpu", "--dtype", "float32",
                 "--output-format", "jsonl", "--quiet", *flags]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]
    return [row["token_ids"] for row in rows]


def test_transcribe_decodes_greedy_ctc_by_default_and_rescores_a_beam(capsys) -> None:
    assert transcribe_ids(capsys) == [r["ctc_greedy"] for r in results()]
    with torch.no_grad():
        expected = rescore_nbest(loaded().model, encoded_batch(), RescoreOptions(beam_size=3))[0]
    assert transcribe_ids(capsys, "--beam-size", "3") == expected


def test_hotwords_are_refused_by_name_on_the_rescoring_beam(capsys) -> None:
    assert main(["transcribe", clip_paths()[0], "--model", str(MODEL), "--device", "cpu", "--quiet",
                 "--beam-size", "2", "--hotwords", "the"]) != 0
    assert "hotwords" in capsys.readouterr().err


def test_rescore_options_are_checked() -> None:
    with pytest.raises(ValueError, match="weight"):
        RescoreOptions(weight=1.5)
    with pytest.raises(ValueError, match="beam_size"):
        RescoreOptions(beam_size=0)


def test_rescore_refuses_uneven_hypothesis_lists() -> None:
    encoded = encoded_alone()[0]
    with pytest.raises(ValueError, match="same number of hypotheses"):
        loaded().model.rescore(encoded, [[[3], [4]], [[5]]])


def test_a_conformer_with_latest_relative_positions_is_refused_naming_the_field(tmp_path: Path, capsys) -> None:
    folder = tmp_path / "conformer"
    shutil.copytree(MODEL, folder)
    config = yaml.safe_load((folder / "config.yaml").read_text(encoding="utf-8"))
    config["encoder_conf"]["rel_pos_type"] = "latest"
    (folder / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    assert main(["transcribe", clip_paths()[0], "--model", str(folder), "--device", "cpu", "--quiet"]) != 0
    assert "encoder_conf.rel_pos_type" in capsys.readouterr().err


@pytest.mark.parametrize("weight", ["0", "1"])
def test_rescore_weight_on_the_command_line_picks_that_weights_best(weight: str, capsys) -> None:
    with torch.no_grad():
        expected = rescore_nbest(loaded().model, encoded_batch(), RescoreOptions(3, float(weight)))[0]
    assert transcribe_ids(capsys, "--beam-size", "3", "--rescore-weight", weight) == expected


def test_rescore_weight_through_the_python_api_and_its_bounds() -> None:
    import oasr

    with torch.no_grad():
        expected = rescore_nbest(loaded().model, encoded_batch(), RescoreOptions(2, 1.0))[0]
    results = oasr.transcribe(clip_paths(), model=str(MODEL), device="cpu", dtype="float32", beam_size=2,
                              rescore_weight=1.0)
    assert [list(r.token_ids) for r in results] == expected
    with pytest.raises(ValueError, match="give beam_size too"):
        DecodeOptions(rescore_weight=0.5)
    with pytest.raises(ValueError, match=r"rescore_weight must be in \[0, 1\]"):
        DecodeOptions(beam_size=2, rescore_weight=-0.1)


def test_a_ctc_model_without_a_decoder_refuses_rescore_weight_by_name(capsys) -> None:
    sense_voice = DATA / "sense_voice"
    assert main(["transcribe", clip_paths()[0], "--model", str(sense_voice), "--device", "cpu", "--quiet",
                 "--beam-size", "2", "--rescore-weight", "0.5"]) != 0
    assert "does not serve the option rescore_weight" in capsys.readouterr().err


def test_rescore_weight_without_a_beam_is_a_clear_error(capsys) -> None:
    assert main(["transcribe", clip_paths()[0], "--model", str(MODEL), "--device", "cpu", "--quiet",
                 "--rescore-weight", "0.5"]) != 0
    err = capsys.readouterr().err
    assert "oasr: error:" in err and "give beam_size too" in err and "Traceback" not in err


def test_the_server_takes_rescore_weight_beside_beam_size_and_refuses_it_alone() -> None:
    import oasr
    import openai

    from oasr.serving.app import build_app
    from oasr.serving.settings import ServerSettings
    from serving_harness import WAIT_S, running_server, small_engine

    clip = Path(clip_paths()[0])
    by_weight = {w: oasr.transcribe(str(clip), model=str(MODEL), device="cpu", dtype="float32", beam_size=3,
                                    rescore_weight=w)[0].text for w in (0.0, 1.0)}
    engine = small_engine(str(MODEL))
    try:
        with running_server(build_app(engine, ServerSettings(served_model_name="conformer"))) as url:
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=WAIT_S)

            def ask(**extra):
                return client.audio.transcriptions.create(file=(clip.name, clip.read_bytes()), model="conformer",
                                                          extra_body=extra).text

            assert {w: ask(beam_size=3, rescore_weight=w) for w in by_weight} == by_weight
            for extra, says in (({"rescore_weight": 0.5}, "give beam_size too"),
                                ({"beam_size": 3, "rescore_weight": 1.5}, "less than or equal to 1")):
                with pytest.raises(openai.BadRequestError) as info:
                    ask(**extra)
                body = info.value.body
                assert body["param"] == "rescore_weight" and says in body["message"], body
    finally:
        engine.shutdown()
