"""Builds the tiny FunASR model folders of tests/data/funasr/ with funasr's own classes and records FunASR's own
outputs for them (the goldens tests/test_funasr*.py compare OASR against).

Run with the oracle venv's python (scripts/setup_oracles.sh makes it), from the repository root:

    /tmp/oracle/funasr/bin/python scripts/funasr_oracle/build_models.py tests/data/funasr

Each model is built from a config in FunASR's own layout, its weights re-drawn so that a tiny random model still
emits tokens that vary with the audio, and saved as FunASR saves a model folder: ``config.yaml``, ``model.pt``
(the state dict), ``am.mvn`` (Kaldi's nnet text of the CMVN shift and scale) and ``tokens.json``. Then
``AutoModel(model=DIR)`` loads the folder as a user would and ``generate`` runs on a few of the shared speech
clips (../shared/data/speech, 16 kHz mono files read with soundfile, as OASR reads them). Nothing here is imported
by the tests; CI reads only the JSON written here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np
import soundfile as sf
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from configs import (  # noqa: E402
    PARAFORMER,
    SENSE_VOICE,
    SENSE_VOICE_BPE,
    write_am_mvn,
    write_sense_voice_bpe,
    write_tokens,
)

REPO = Path(__file__).resolve().parents[2]
SPEECH = Path(os.environ.get("OASR_SPEECH_DATA") or REPO.parent / "shared" / "data" / "speech")
# Shared clips already at 16 kHz mono (no resampler between the two sides), of different lengths.
CLIPS = {
    "ps_librivox_0880": "en/pocketsphinx/sense_and_sensibility_01_austen_64kb-0880.wav",
    "ds_ldc93s1": "en/deepspeech/LDC93S1.wav",
    "picovoice_leopard_ja": "multilingual/ja/picovoice-leopard/test_ja.wav",
}
# Feature goldens keep these many LFR frames from each end in full (the stacking's edge cases), and every
# frame's mean and every column's mean over the whole clip.
EDGE_FRAMES = 8


def read_clips() -> dict[str, np.ndarray]:
    clips = {}
    for name, path in CLIPS.items():
        audio, rate = sf.read(SPEECH / path, dtype="float32")
        assert rate == 16_000 and audio.ndim == 1, (name, rate, audio.shape)
        clips[name] = audio
    return clips


def randomize(model: torch.nn.Module, seed: int) -> None:
    """Unit-gain matrices, layer norms near one, small biases: a tiny random model whose outputs vary."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            if tensor.dim() >= 2:
                fan_in = tensor[0].numel()
                tensor.copy_(torch.randn(tensor.shape, generator=generator) / fan_in**0.5)
            elif "norm" in name and name.endswith("weight"):
                tensor.copy_(1 + 0.2 * torch.randn(tensor.shape, generator=generator))
            else:
                tensor.copy_(0.1 * torch.randn(tensor.shape, generator=generator))


def rounded(values, digits: int = 6) -> list:
    return np.round(np.asarray(values, dtype=np.float64), digits).tolist()


def feature_golden(frontend, audio: np.ndarray) -> dict:
    """FunASR's WavFrontend on one clip: the edge frames in full, every frame's and every column's mean."""
    feats, lengths = frontend(torch.from_numpy(audio)[None, :], torch.tensor([len(audio)]))
    feats = feats[0].numpy().astype(np.float64)
    return {"num_frames": int(lengths[0]), "dim": feats.shape[1], "head": rounded(feats[:EDGE_FRAMES]),
            "tail": rounded(feats[-EDGE_FRAMES:]), "frame_means": rounded(feats.mean(axis=1)),
            "column_means": rounded(feats.mean(axis=0))}


def build_paraformer(out: Path, clips: dict[str, np.ndarray]) -> None:
    from funasr import AutoModel
    from funasr.models.paraformer.model import Paraformer

    folder = out / "paraformer"
    folder.mkdir(parents=True, exist_ok=True)
    config = PARAFORMER
    tokens = write_tokens(folder / "tokens.json")
    write_am_mvn(folder / "am.mvn", config["frontend_conf"]["n_mels"] * config["frontend_conf"]["lfr_m"], seed=3)
    import yaml

    (folder / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True))
    model = Paraformer(**{k: v for k, v in config.items() if k not in ("model", "frontend", "frontend_conf",
                                                                      "tokenizer", "tokenizer_conf")},
                       vocab_size=len(tokens), **config["model_conf"])
    randomize(model, seed=11)
    with torch.no_grad():  # CIF weights of about 0.35 a frame: a token every three encoder frames or so
        model.predictor.cif_output.bias.fill_(-0.6)
    torch.save(model.state_dict(), folder / "model.pt")

    auto = AutoModel(model=str(folder), device="cpu", disable_update=True, disable_pbar=True, log_level="ERROR")
    frontend = auto.kwargs["frontend"]
    golden = {"clips": list(clips), "features": {}, "token_ids": [], "texts": [], "timestamp_texts": [],
              "word_timestamps": [], "token_timestamps": []}
    for name, audio in clips.items():
        golden["features"][name] = feature_golden(frontend, audio)
        plain = auto.generate(input=audio, disable_pbar=True)[0]
        timed = auto.generate(input=audio, output_timestamp=True, disable_pbar=True)[0]
        ids = auto.model.inference([audio], key=[name], tokenizer=None, frontend=frontend, device="cpu")[0][0]
        golden["token_ids"].append([int(i) for i in ids["token_int"]])
        golden["texts"].append(plain["text"])
        golden["timestamp_texts"].append(timed["text"])
        golden["word_timestamps"].append(timed.get("timestamp", []))
        golden["token_timestamps"].append(token_timestamps(auto, audio, tokens))
    (out / "paraformer.json").write_text(json.dumps(golden, ensure_ascii=False, indent=1) + "\n")
    print("paraformer:", golden["texts"], [len(t) for t in golden["token_ids"]])


def token_timestamps(auto, audio: np.ndarray, tokens: list[str]) -> list[list[int]]:
    """Per-token [start_ms, end_ms] as Paraformer's inference computes them before grouping tokens into words."""
    import copy

    from funasr.utils.timestamp_tools import ts_prediction_lfr6_standard

    model, frontend = auto.model, auto.kwargs["frontend"]
    feats, lengths = frontend(torch.from_numpy(audio)[None, :], torch.tensor([len(audio)]))
    with torch.no_grad():
        encoder_out, encoder_lens = model.encode(feats, lengths)
        embeds, token_num, alphas, peaks = model.calc_predictor(encoder_out, encoder_lens)
        token_num = token_num.round().long()
        decoder_out, _ = model.cal_decoder_with_predictor(encoder_out, encoder_lens, embeds, token_num)
    ids = [i for i in decoder_out[0, : token_num[0]].argmax(-1).tolist() if i not in (0, 1, 2)]
    span = min(int(encoder_lens[0]) + 1, peaks.shape[-1], alphas.shape[-1])
    _, stamps = ts_prediction_lfr6_standard(peaks[0][:span], alphas[0][:span], copy.copy([tokens[i] for i in ids]),
                                            upsample_rate=1)
    return stamps


# (language, ITN) pairs SenseVoice is run with: auto and forced languages, ITN on and off.
SENSE_VOICE_RUNS = (("auto", False), ("auto", True), ("en", False), ("zh", True), ("ja", False))


def build_sense_voice(out: Path, clips: dict[str, np.ndarray]) -> None:
    from funasr import AutoModel
    from funasr.models.sense_voice.model import SenseVoiceSmall

    folder = out / "sense_voice"
    folder.mkdir(parents=True, exist_ok=True)
    config = SENSE_VOICE
    write_sense_voice_bpe(folder / SENSE_VOICE_BPE, seed=5)
    import sentencepiece as spm
    import yaml

    vocab_size = spm.SentencePieceProcessor(model_file=str(folder / SENSE_VOICE_BPE)).get_piece_size()
    write_am_mvn(folder / "am.mvn", config["frontend_conf"]["n_mels"] * config["frontend_conf"]["lfr_m"], seed=4)
    (folder / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True))
    # As SenseVoice-Small's folder: configuration.json names the files, the BPE model under its own name.
    (folder / "configuration.json").write_text(json.dumps({
        "framework": "pytorch", "task": "auto-speech-recognition", "model": {"type": "funasr"},
        "file_path_metas": {"init_param": "model.pt", "config": "config.yaml",
                            "tokenizer_conf": {"bpemodel": SENSE_VOICE_BPE}, "frontend_conf": {"cmvn_file": "am.mvn"}},
    }, indent=1) + "\n")
    model = SenseVoiceSmall(**{k: v for k, v in config.items() if k not in ("model", "frontend", "frontend_conf",
                                                                           "tokenizer", "tokenizer_conf", "model_conf")},
                            vocab_size=vocab_size, **config["model_conf"])
    randomize(model, seed=13)
    with torch.no_grad():  # tag rows apart from the rest, so that each query frame has a token of its own
        model.embed.weight.mul_(4.0)
    torch.save(model.state_dict(), folder / "model.pt")

    auto = AutoModel(model=str(folder), device="cpu", disable_update=True, disable_pbar=True, log_level="ERROR")
    golden = {"clips": list(clips), "runs": []}
    for language, itn in SENSE_VOICE_RUNS:
        run = {"language": language, "use_itn": itn, "token_ids": [], "texts": []}
        for name, audio in clips.items():
            result = auto.generate(input=audio, language=language, use_itn=itn, disable_pbar=True)[0]
            run["texts"].append(result["text"])
            run["token_ids"].append(sense_voice_ids(auto, audio, language, itn))
        golden["runs"].append(run)
    (out / "sense_voice.json").write_text(json.dumps(golden, ensure_ascii=False, indent=1) + "\n")
    print("sense_voice:", [r["texts"] for r in golden["runs"]])


def sense_voice_ids(auto, audio: np.ndarray, language: str, itn: bool) -> list[int]:
    """The token ids SenseVoice's inference decodes into its text: the CTC head's best label per frame (the four
    query frames included), repeats merged, blanks dropped, as ``SenseVoiceSmall.inference`` does."""
    model, frontend = auto.model, auto.kwargs["frontend"]
    feats, lengths = frontend(torch.from_numpy(audio)[None, :], torch.tensor([len(audio)]))
    with torch.no_grad():
        language_query = model.embed(torch.LongTensor([[model.lid_dict[language]]]))
        style_query = model.embed(torch.LongTensor([[model.textnorm_dict["withitn" if itn else "woitn"]]]))
        queries = torch.cat((language_query, model.embed(torch.LongTensor([[1, 2]])), style_query), dim=1)
        encoder_out, encoder_lens = model.encoder(torch.cat((queries, feats), dim=1), lengths + 4)
        labels = model.ctc.log_softmax(encoder_out)[0, : int(encoder_lens[0])].argmax(-1)
    labels = torch.unique_consecutive(labels)
    return [int(i) for i in labels[labels != model.blank_id]]


# Token lists that walk FunASR's text rules (postprocess_utils.sentence_postprocess): Chinese only, English
# words and @@ pieces, single-letter runs (abbreviations), mixed, and tokens it drops or keeps untimed.
TEXT_CASES = (
    ["欢", "迎", "大", "家"],
    ["he@@", "llo", "world", "th@@", "ing", "s"],
    ["a", "b", "c", "is", "x", "y"],
    ["我", "在", "th@@", "e", "a", "b", "国", "1", "2", "o@@", "k"],
    ["<s>", "the", "<unk>", "中", "a", "</s>", "b", "c", "国"],
    ["中", "it's", "ok", "-", "国"],
    ["x", "中", "y", "z"],
)


def build_text_rules(out: Path) -> None:
    """FunASR's words and text for each case, with and without per-token times (100 ms per token)."""
    from funasr.utils.postprocess_utils import sentence_postprocess

    cases = []
    for tokens in TEXT_CASES:
        text, words = sentence_postprocess(list(tokens))
        spans = [[100 * i, 100 * (i + 1)] for i in range(len(tokens))]
        timed_text, timed_spans, timed_words = sentence_postprocess(list(tokens), [list(s) for s in spans])
        cases.append({"tokens": list(tokens), "text": text, "words": words, "spans": spans,
                      "timed_text": timed_text, "timed_words": timed_words, "timed_spans": timed_spans})
    (out / "text_rules.json").write_text(json.dumps(cases, ensure_ascii=False, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    clips = read_clips()
    build_paraformer(args.out, clips)
    build_sense_voice(args.out, clips)
    build_text_rules(args.out)


if __name__ == "__main__":
    main()
