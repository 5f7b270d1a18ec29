"""Builds tests/data/funasr/seaco_paraformer/, a tiny SeACo-Paraformer made with funasr's own classes in FunASR's
folder layout, and records what FunASR's ``AutoModel.generate`` makes of three shared clips with no hotword and
with two hotword lists (tests/data/funasr/seaco_paraformer.json).

Run with the oracle venv's python (scripts/setup_oracles.sh makes it), from the repository root:

    /tmp/oracle/funasr/bin/python scripts/funasr_oracle/build_seaco.py tests/data/funasr

The layout is SeACo-Paraformer-large's at a tiny size: the Paraformer parts with the timestamp predictor
(``CifPredictorV3``), an LSTM bias encoder over the decoder's token embeddings, a SANM "seaco" decoder that
attends from the token positions to the hotwords, and ``hotword_output_layer``. A ``seg_dict`` beside ``am.mvn``
spells words as tokens, as the released folders' does. The weights are drawn at random, then the hotwords' share
of the seaco decoder and the hotword head's "no bias" class are raised, so that most positions keep the plain
decoder's token, the hotwords change some of them, and the two lists change different ones.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import numpy as np
import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from build_models import read_clips, randomize  # noqa: E402
from configs import PARAFORMER, TOKENS, write_am_mvn, write_tokens  # noqa: E402

NO_BIAS = len(TOKENS) - 1  # the hotword head's "no hotword here" class: FunASR's config names it (8377 for -large)
SEACO = {
    **copy.deepcopy(PARAFORMER),
    "model": "SeacoParaformer",
    "model_conf": {**PARAFORMER["model_conf"], "inner_dim": 40, "bias_encoder_type": "lstm",
                   "bias_encoder_bid": False, "seaco_lsm_weight": 0.1, "seaco_length_normalized_loss": True,
                   "NO_BIAS": NO_BIAS, "seaco_weight": 1.0},
    "predictor": "CifPredictorV3",
    "predictor_conf": {"idim": 40, "threshold": 1.0, "l_order": 1, "r_order": 1, "tail_threshold": 0.45,
                       "smooth_factor2": 0.25, "noise_threshold2": 0.01, "upsample_times": 3,
                       "use_cif1_cnn": False, "upsample_type": "cnn_blstm"},
    # As SeACo-Paraformer-large's: num_blocks below the default att_layer_num (6), so six cross-attention layers.
    "seaco_decoder": "ParaformerSANMDecoder",
    "seaco_decoder_conf": {"attention_heads": 4, "linear_units": 64, "num_blocks": 2, "dropout_rate": 0.1,
                           "positional_dropout_rate": 0.1, "self_attention_dropout_rate": 0.1,
                           "src_attention_dropout_rate": 0.1, "kernel_size": 11, "sanm_shfit": 0,
                           "use_output_layer": False, "wo_input_layer": True},
}
# Words spelled as tokens (English words as pieces) and the Chinese characters the hotwords use, one a line.
SEG_DICT = {"thing": "th@@ ing", "rely": "re@@ ly", "the": "the", "coin": "co@@ in@@ n", **{c: c for c in "中国大人说"}}
# FunASR's ``hotword=`` strings (whitespace-separated words, each one hotword); OASR's phrases are the same
# words comma-separated. "Thing" is lowercased through seg_dict, "xyz" is in neither list (<unk>), "中国" is
# spelled character by character.
HOTWORDS = (None, "Thing 中国 coin", "rely xyz 大人 说")


def build_seaco(out: Path) -> None:
    from funasr.models.seaco_paraformer.model import SeacoParaformer

    folder = out / "seaco_paraformer"
    folder.mkdir(parents=True, exist_ok=True)
    tokens = write_tokens(folder / "tokens.json")
    front = SEACO["frontend_conf"]
    write_am_mvn(folder / "am.mvn", front["n_mels"] * front["lfr_m"], seed=3)
    (folder / "seg_dict").write_text("".join(f"{w} {t}\n" for w, t in SEG_DICT.items()), encoding="utf-8")
    (folder / "config.yaml").write_text(yaml.safe_dump(SEACO, sort_keys=False, allow_unicode=True))
    skip = ("model", "frontend", "frontend_conf", "tokenizer", "tokenizer_conf")
    model = SeacoParaformer(**{k: v for k, v in SEACO.items() if k not in skip}, vocab_size=len(tokens),
                            **SEACO["model_conf"])
    randomize(model, seed=11)
    with torch.no_grad():
        model.predictor.cif_output.bias.fill_(-0.6)  # as the Paraformer's: a token every three frames or so
        # The hotwords' share of the seaco decoder raised, so that the two lists steer it apart; the no-bias class
        # raised, so that the plain decoder keeps most positions (values found by trying a few).
        for layer in model.seaco_decoder.decoders:
            layer.src_attn.linear_out.weight.mul_(6.0)
            layer.src_attn.linear_out.bias.mul_(6.0)
        model.hotword_output_layer.bias[NO_BIAS] += 6.0
    torch.save(model.state_dict(), folder / "model.pt")


def goldens(out: Path) -> dict:
    from funasr import AutoModel

    folder = out / "seaco_paraformer"
    auto = AutoModel(model=str(folder), device="cpu", disable_update=True, disable_pbar=True, log_level="ERROR")
    tokenizer_class = type(auto.kwargs["tokenizer"])  # generate works on a copy of the instance: patch its class
    seen: list[list[int]] = []
    ids2tokens = tokenizer_class.ids2tokens

    def recording(self, ids):  # the token ids inference hands the tokenizer: FunASR's result holds only text
        seen.append([int(i) for i in ids])
        return ids2tokens(self, ids)

    tokenizer_class.ids2tokens = recording
    clips = read_clips()
    golden = {"clips": list(clips), "hotwords": [h.split() if h else [] for h in HOTWORDS], "runs": []}
    for hotword in HOTWORDS:
        run = {"token_ids": [], "texts": []}
        for audio in clips.values():
            seen.clear()
            result = auto.generate(input=audio, hotword=hotword, disable_pbar=True)[0]
            assert len(seen) == 1, seen
            run["token_ids"].append(seen[0])
            run["texts"].append(result["text"])
        golden["runs"].append(run)
        print(hotword, run["texts"], [len(t) for t in run["token_ids"]])
    plain = golden["runs"][0]["token_ids"]
    for run in golden["runs"][1:]:
        assert run["token_ids"] != plain, "a hotword list changed nothing: raise the weights' effect"
    assert golden["runs"][1]["token_ids"] != golden["runs"][2]["token_ids"], "the two lists steer alike"
    return golden


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    torch.manual_seed(0)
    np.random.seed(0)
    build_seaco(args.out)
    golden = goldens(args.out)
    (args.out / "seaco_paraformer.json").write_text(json.dumps(golden, ensure_ascii=False, indent=1) + "\n")


if __name__ == "__main__":
    main()
