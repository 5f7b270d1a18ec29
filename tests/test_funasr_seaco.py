"""FunASR's SeACo-Paraformer (hotwords) through ``oasr transcribe`` and the engine, against FunASR's own outputs.

tests/data/funasr/seaco_paraformer/ is a tiny random SeACo-Paraformer built with funasr's own classes in FunASR's
folder layout (config.yaml, model.pt, am.mvn, tokens.json, seg_dict); seaco_paraformer.json holds the token ids
and text funasr 1.4.16's ``AutoModel(model=DIR).generate(input=clip, hotword=...)`` gave on three shared clips
with no hotword and with two lists (FunASR's whitespace-separated words; OASR's phrases are the same words,
comma-separated). scripts/funasr_oracle/build_seaco.py made them; CI never runs FunASR.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oasr.cli import main
from oasr.errors import UnsupportedOptionError
from oasr.types import DecodeOptions, Hotword
from tests.speech_data import audio_path, require_speech_data

DATA = Path(__file__).parent / "data" / "funasr"
MODEL = DATA / "seaco_paraformer"


def golden() -> dict:
    return json.loads((DATA / "seaco_paraformer.json").read_text(encoding="utf-8"))


def clip_paths() -> list[str]:
    by_id = {e["id"]: e for e in require_speech_data()}
    return [str(audio_path(by_id[name])) for name in golden()["clips"]]


def transcribe(capsys, *extra: str) -> list[dict]:
    assert main(["transcribe", *clip_paths(), "--model", str(MODEL), "--device", "cpu", "--dtype", "float32",
                 "--output-format", "jsonl", "--quiet", *extra]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]


def test_the_goldens_show_hotwords_steering_the_output() -> None:
    runs = golden()["runs"]
    assert runs[1]["token_ids"] != runs[0]["token_ids"] and runs[2]["token_ids"] != runs[1]["token_ids"]


def test_seaco_without_hotwords_gives_funasrs_tokens_and_text(capsys) -> None:
    expected = golden()["runs"][0]
    rows = transcribe(capsys)
    assert [row["token_ids"] for row in rows] == expected["token_ids"]
    assert [row["text"] for row in rows] == expected["texts"]


@pytest.mark.parametrize(("run", "beam"), [(1, ["--beam-size", "1"]), (2, [])])  # the hotwords need no beam
def test_seaco_hotwords_give_funasrs_tokens_and_text(capsys, run: int, beam: list[str]) -> None:
    expected = golden()
    rows = transcribe(capsys, *beam, "--hotwords", ",".join(expected["hotwords"][run]))
    assert [row["token_ids"] for row in rows] == expected["runs"][run]["token_ids"]
    assert [row["text"] for row in rows] == expected["runs"][run]["texts"]


def test_rows_with_different_hotword_lists_in_one_batch_each_get_their_own() -> None:
    from oasr.engine.engine import ASREngine
    from oasr.models.loader import from_pretrained
    from oasr.types import DecodeOptions, Hotword
    from tests.speech_data import clips

    expected = golden()
    engine = ASREngine(from_pretrained(MODEL, device="cpu", dtype="float32"))
    audio = [clip.audio for clip in clips(expected["clips"])]
    asks = {}  # request id -> (clip, run): every clip under no list and under each list, all queued at once
    for run, words in enumerate(expected["hotwords"]):
        options = DecodeOptions(beam_size=1, hotwords=tuple(Hotword(w) for w in words)) if words else DecodeOptions()
        for i, samples in enumerate(audio):
            asks[engine.add_request(samples, options)] = (i, run)
    got = {}
    steps = 0
    while engine.has_unfinished():
        got.update({out.request_id: out.token_ids for out in engine.step() if out.finished})
        steps += 1
    assert steps == 1  # one encode batch held all nine rows
    for request_id, (i, run) in asks.items():
        assert list(got[request_id]) == expected["runs"][run]["token_ids"][i], (i, run)


def refusal(capsys, model: Path, *extra: str) -> str:
    """The CLI's error line for a run that must be refused."""
    assert main(["transcribe", clip_paths()[0], "--model", str(model), "--device", "cpu", "--quiet", *extra]) != 0
    return capsys.readouterr().err


def test_a_boost_or_a_wider_beam_is_refused_by_name(capsys) -> None:
    assert "carry no boost" in refusal(capsys, MODEL, "--beam-size", "1", "--hotwords", "thing:3")
    assert "no wider than beam_size 1, got 2" in refusal(capsys, MODEL, "--beam-size", "2", "--hotwords", "thing")


def test_hotwords_need_no_beam_size_on_seaco_and_still_do_elsewhere() -> None:
    """SeACo's network takes the hotwords (its record: hotwords_need_beam False), so a request gives them alone and
    decodes as with beam_size 1; a CTC model's hotwords steer its prefix search and still need beam_size."""
    from oasr.models import ARCHITECTURES
    from oasr.models.capabilities import capabilities_of, check_options

    seaco, ctc = (capabilities_of(ARCHITECTURES.get(name)) for name in ("seaco_paraformer", "parakeet_ctc"))
    assert not seaco.hotwords_need_beam and ctc.hotwords_need_beam
    alone = DecodeOptions(hotwords=(Hotword("x"),))
    check_options(seaco, alone, "seaco")
    assert seaco.strategy_for(alone) == "cif_hotwords" and seaco.strategy_for(DecodeOptions()) == "cif_greedy"
    with pytest.raises(UnsupportedOptionError, match="give beam_size too"):
        check_options(ctc, alone, "ctc")


def test_only_the_seaco_checkpoint_serves_hotwords(capsys) -> None:
    from oasr.models import ARCHITECTURES
    from oasr.models.capabilities import capabilities_of

    assert "hotwords" not in capabilities_of(ARCHITECTURES.get("paraformer")).served_options
    assert "hotwords" in capabilities_of(ARCHITECTURES.get("seaco_paraformer")).served_options
    assert "does not serve the option" in refusal(capsys, DATA / "paraformer", "--beam-size", "1", "--hotwords", "x")


def test_too_many_hotwords_are_refused_rather_than_filtered(capsys) -> None:
    many = ",".join(f"w{i}" for i in range(50))
    assert "at most 49" in refusal(capsys, MODEL, "--beam-size", "1", "--hotwords", many)


def test_phrases_are_spelled_as_funasr_spells_a_hotword_line() -> None:
    from oasr.models.seaco_paraformer.hotwords import HotwordSpelling

    tokens = ("<blank>", "<s>", "</s>", "中", "国", "th@@", "ing", "<unk>")
    seg_dict = {"thing": ("th@@", "ing"), "中": ("中",), "国": ("国",)}
    spelling = HotwordSpelling(tokens, seg_dict)
    assert spelling.spell("Thing 中国") == [5, 6, 3, 4]  # lowercased, then CJK character by character
    assert spelling.spell("xyz 中x") == [7, 7]  # in neither the dict nor all CJK: <unk> a word
    assert HotwordSpelling(tokens).spell("thing 中") == [7, 3]  # no seg_dict: each word must be a token


def test_a_bidirectional_bias_encoder_is_refused_naming_the_field(tmp_path: Path) -> None:
    import shutil

    import yaml

    from oasr.errors import CheckpointError
    from oasr.models.loader import from_pretrained

    folder = tmp_path / "seaco"
    shutil.copytree(MODEL, folder)
    config = yaml.safe_load((folder / "config.yaml").read_text(encoding="utf-8"))
    config["model_conf"]["bias_encoder_bid"] = True
    (folder / "config.yaml").write_text(yaml.safe_dump(config, allow_unicode=True), encoding="utf-8")
    with pytest.raises(CheckpointError, match="model_conf.bias_encoder_bid"):
        from_pretrained(folder, device="cpu")


def test_the_server_takes_seaco_hotwords_alone_and_refuses_a_wider_beam() -> None:
    import openai

    from oasr.serving.app import build_app
    from oasr.serving.settings import ServerSettings
    from serving_harness import WAIT_S, running_server, small_engine

    expected = golden()
    clip = Path(clip_paths()[0])
    engine = small_engine(str(MODEL))
    try:
        with running_server(build_app(engine, ServerSettings(served_model_name="seaco"))) as url:
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=WAIT_S)
            hotwords = ",".join(expected["hotwords"][2])
            answer = client.audio.transcriptions.create(file=(clip.name, clip.read_bytes()), model="seaco",
                                                        extra_body={"hotwords": hotwords})
            assert answer.text == expected["runs"][2]["texts"][0] != expected["runs"][0]["texts"][0]
            with pytest.raises(openai.BadRequestError) as info:
                client.audio.transcriptions.create(file=(clip.name, clip.read_bytes()), model="seaco",
                                                   extra_body={"hotwords": hotwords, "beam_size": 2})
            body = info.value.body
            assert body["param"] == "beam_size" and "no wider than beam_size 1" in body["message"], body
    finally:
        engine.shutdown()
