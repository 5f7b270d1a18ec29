"""Builds the tiny CT-Transformer punctuation folder of tests/data/funasr/ (``ct_punc/``) with funasr's own
``CTTransformer`` and records what ``AutoModel(model=DIR).generate(input=text)`` writes for unpunctuated texts:
English, Chinese and mixed, shorter and longer than its 20-word mini-sentences, and the texts the tiny Paraformer
golden (``paraformer.json``) transcribed, which is what ``oasr transcribe --punctuate`` must print for them.

    /tmp/oracle/funasr/bin/python scripts/funasr_oracle/build_punc.py tests/data/funasr

The folder is laid out as the released ``ct-punc`` folders are: ``config.yaml`` (``model: CTTransformer``, a
``SANMEncoder``, ``punc_list`` in ``model_conf``), ``model.pt`` and ``tokens.json`` (index = token id). Nothing here
is imported by the tests; CI reads only the JSON written here.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from build_models import randomize  # noqa: E402
from configs import TOKENS  # noqa: E402

# The released ct-punc config at a tiny size: embedding and attention width 32, four SANM layers, the released
# punctuation list (id 1 "_" is no punctuation; 3 "。" ends a sentence).
CT_PUNC = {
    "model": "CTTransformer",
    "model_conf": {"ignore_id": 0, "embed_unit": 32, "att_unit": 32, "dropout_rate": 0.1,
                   "punc_list": ["<unk>", "_", "，", "。", "？", "、"],
                   "punc_weight": [1.0, 1.0, 1.0, 1.0, 1.0, 1.0], "sentence_end_id": 3},
    "encoder": "SANMEncoder",
    "encoder_conf": {"input_size": 32, "output_size": 32, "attention_heads": 4, "linear_units": 64, "num_blocks": 4,
                     "dropout_rate": 0.1, "positional_dropout_rate": 0.1, "attention_dropout_rate": 0.0,
                     "input_layer": "pe", "pos_enc_class": "SinusoidalPositionEncoder", "normalize_before": True,
                     "kernel_size": 11, "sanm_shfit": 0, "selfattention_layer_type": "sanm", "padding_idx": 0},
    "tokenizer": "CharTokenizer",
    "tokenizer_conf": {"unk_symbol": "<unk>"},
}

# The Paraformer vocabulary's words and characters (so its transcripts read as known tokens) and more of both.
PUNC_TOKENS = [*TOKENS[:-1], *"好么吗今天去哪里呢看书学习工作", "hello", "world", "we", "go", "home", "are",
               "what", "where", "today", "this", "yes", "no", "i", "am", "not", "sure", "<unk>"]

# Raw logits of the tiny model favour no punctuation ("_"), as a trained model's do; these offsets keep the
# other marks frequent enough that each text gets some, and <unk> (a real model never writes it) out.
PUNC_BIAS = [-20.0, 1.6, 0.6, 0.4, -0.2, -0.4]
SEED = 23

LONG_EN = ("so we go home today and this is what we are sure of we go where the work is and i am not sure "
           "that he is there but it was a good day to go and we are home now and you are not")
LONG_ZH = "我们今天去哪里看书学习他说我们去工作也好你在这里有大人来了吗今天我们不去了他们在国中说这个年时的子和地出道好么"
TEXTS = [
    "hello world",
    "我们去工作",
    "yes",
    "好",
    "",
    "   ",
    LONG_EN,
    LONG_ZH,
    LONG_EN + " " + LONG_EN,
    "我们用iphone打电话 and then we go home 你好吗",
    "he was born in 1990 and 他 is 30",
    "THE BBC is here today 我们 are Not sure",
    "我 我 我 we we 1 2 3 的 the 的 the 他 he 他 he 中 国 a a a",
    LONG_ZH + LONG_ZH + LONG_ZH + "hello world" + LONG_ZH,
]


# FunASR's inference on scripted classes (each word's class fixed by the word, whatever its neighbours): the
# mini-sentence carry, the comma cut of a carried run past 200 words and the last mark's rewriting, which a
# random model seldom reaches. Words not named get "_".
SCRIPTED_CLASSES = {"他": 3, "he": 3, "我": 2, "the": 2, "的": 4, "is": 4, "是": 5, "and": 5, "年": 0}
SCRIPTED_TEXTS = [
    " ".join(["我们", "一", "在"] * 80),  # 240 words, commas only: carried past 200 words, then cut at a comma
    "a b c d e f g h i j k l m n o p q he r s t u v w x y z a b c d e f g h i j k the",
    "你好 hello world he said 我 是 the end and",
    "一二三他hello the world 的 again is",
    "the year 年",
    "出国是",
    "出国我",
    " ".join(["you", "a", "he", "in"] * 30) + " 的",
]


def scripted_forward(classes: dict[int, int], num_marks: int):
    """A ``punc_forward`` whose logits pick each word's scripted class."""
    def forward(text: torch.Tensor, text_lengths: torch.Tensor, **kwargs):
        ids = text[0].tolist()
        logits = torch.zeros(1, len(ids), num_marks)
        for position, token in enumerate(ids):
            logits[0, position, classes.get(token, 1)] = 1.0
        return logits, None
    return forward


def scripted_golden(auto) -> dict:
    vocabulary = {token: index for index, token in enumerate(PUNC_TOKENS)}
    by_id = {vocabulary[word]: mark for word, mark in SCRIPTED_CLASSES.items()}
    auto.model.punc_forward = scripted_forward(by_id, len(CT_PUNC["model_conf"]["punc_list"]))
    try:
        texts = [auto.generate(input=text, disable_pbar=True)[0]["text"] for text in SCRIPTED_TEXTS]
    finally:
        del auto.model.punc_forward
    return {"classes": SCRIPTED_CLASSES, "inputs": SCRIPTED_TEXTS, "texts": texts}


def model_kwargs(config: dict) -> dict:
    skip = ("model", "tokenizer", "tokenizer_conf", "model_conf")
    return {**{k: v for k, v in config.items() if k not in skip}, **config["model_conf"]}


def build_folder(folder: Path) -> None:
    from funasr.models.ct_transformer.model import CTTransformer

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.yaml").write_text(yaml.safe_dump(CT_PUNC, sort_keys=False, allow_unicode=True),
                                        encoding="utf-8")
    (folder / "tokens.json").write_text(json.dumps(PUNC_TOKENS, ensure_ascii=False, indent=1) + "\n",
                                        encoding="utf-8")
    model = CTTransformer(**model_kwargs(CT_PUNC), vocab_size=len(PUNC_TOKENS))
    randomize(model, seed=SEED)
    with torch.no_grad():
        model.embed.weight.mul_(3.0)  # unit-gain rows would vanish under the sinusoid the encoder adds
        model.decoder.bias.copy_(torch.tensor(PUNC_BIAS))
    torch.save(model.state_dict(), folder / "model.pt")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    from funasr import AutoModel

    folder = args.out / "ct_punc"
    build_folder(folder)
    auto = AutoModel(model=str(folder), device="cpu", disable_update=True, disable_pbar=True, log_level="ERROR")
    paraformer = json.loads((args.out / "paraformer.json").read_text(encoding="utf-8"))
    golden = {"split_size": 20, "texts": [], "paraformer": {"clips": paraformer["clips"], "texts": []}}
    for text in TEXTS:
        result = auto.generate(input=text, disable_pbar=True)[0]
        array = result["punc_array"]
        golden["texts"].append({"input": text, "text": result["text"],
                                "punc_array": [] if array is None else [int(x) for x in array.reshape(-1)]})
    for text in paraformer["texts"]:
        golden["paraformer"]["texts"].append(auto.generate(input=text, disable_pbar=True)[0]["text"])
    golden["scripted"] = scripted_golden(auto)
    (args.out / "ct_punc.json").write_text(json.dumps(golden, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    for entry in golden["texts"]:
        print(repr(entry["text"]))
    print("paraformer:", golden["paraformer"]["texts"])
    for text in golden["scripted"]["texts"]:
        print("scripted:", repr(text))


if __name__ == "__main__":
    main()
