"""Builds the tiny streaming FunASR model folders of tests/data/funasr/ (the online Paraformer and FSMN-VAD) with
funasr's own classes and records what FunASR's streaming inference gives for them, fed chunk by chunk with a
``cache`` and ``is_final`` as FunASR's own examples feed it.

    /tmp/oracle/funasr/bin/python scripts/funasr_oracle/build_streaming.py tests/data/funasr

Nothing here is imported by the tests; CI reads only the JSON written here.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from build_models import randomize, read_clips  # noqa: E402
from configs import FSMN_VAD, PARAFORMER_STREAMING, write_am_mvn, write_tokens  # noqa: E402

# FunASR's example setting: chunks of 10 LFR frames (600 ms) with a 5-frame look-ahead, 4 chunks of encoder and
# 1 of decoder look-back.
CHUNK_SIZE = [0, 10, 5]
ENCODER_CHUNK_LOOK_BACK = 4
DECODER_CHUNK_LOOK_BACK = 1
# One LFR frame is 60 ms: 960 samples at 16 kHz.
CHUNK_SAMPLES = CHUNK_SIZE[1] * 960
# FSMN-VAD is fed in 200 ms pieces in FunASR's streaming example.
VAD_CHUNK_MS = 200
# The tiny network's silence logit is raised until its silence share crosses the speech/noise threshold within
# the shared clips, so that segments start after the clip starts (and one clip has none).
SILENCE_BIAS = 6.0
# Frame scores kept in the golden: the silence state's probability on this many frames from the start.
NUM_SCORE_FRAMES = 40


def save_folder(folder: Path, config: dict, model: torch.nn.Module) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True))
    torch.save(model.state_dict(), folder / "model.pt")


def model_kwargs(config: dict) -> dict:
    skip = ("model", "frontend", "frontend_conf", "tokenizer", "tokenizer_conf", "model_conf")
    return {**{k: v for k, v in config.items() if k not in skip}, **config["model_conf"]}


def build_paraformer_streaming(out: Path, clips: dict[str, np.ndarray]) -> None:
    from funasr import AutoModel
    from funasr.models.paraformer_streaming.model import ParaformerStreaming

    folder = out / "paraformer_streaming"
    folder.mkdir(parents=True, exist_ok=True)
    config = PARAFORMER_STREAMING
    tokens = write_tokens(folder / "tokens.json")
    write_am_mvn(folder / "am.mvn", config["frontend_conf"]["n_mels"] * config["frontend_conf"]["lfr_m"], seed=6)
    model = ParaformerStreaming(**model_kwargs(config), vocab_size=len(tokens))
    randomize(model, seed=11)
    with torch.no_grad():
        # Without the output bias the tiny decoder's tokens follow the audio rather than one favoured row.
        model.decoder.output_layer.bias.zero_()
        # CIF weights of about 0.35 a frame: a token every three encoder frames or so, as the offline tiny model.
        model.predictor.cif_output.bias.fill_(-0.6)
    save_folder(folder, config, model)

    auto = AutoModel(model=str(folder), device="cpu", disable_update=True, disable_pbar=True, log_level="ERROR")
    golden = {"clips": list(clips), "chunk_size": CHUNK_SIZE, "encoder_chunk_look_back": ENCODER_CHUNK_LOOK_BACK,
              "decoder_chunk_look_back": DECODER_CHUNK_LOOK_BACK, "chunk_samples": CHUNK_SAMPLES, "partials": []}
    for audio in clips.values():
        cache: dict = {}
        num_chunks = (len(audio) - 1) // CHUNK_SAMPLES + 1
        partials = []
        for index in range(num_chunks):
            piece = audio[index * CHUNK_SAMPLES: (index + 1) * CHUNK_SAMPLES]
            result = auto.generate(input=piece, cache=cache, is_final=index == num_chunks - 1,
                                   chunk_size=CHUNK_SIZE, encoder_chunk_look_back=ENCODER_CHUNK_LOOK_BACK,
                                   decoder_chunk_look_back=DECODER_CHUNK_LOOK_BACK, disable_pbar=True)
            partials.append(result[0]["text"])
        golden["partials"].append(partials)
    (out / "paraformer_streaming.json").write_text(json.dumps(golden, ensure_ascii=False, indent=1) + "\n")
    print("paraformer_streaming:", golden["partials"])


def build_fsmn_vad(out: Path, clips: dict[str, np.ndarray], silence_bias: float) -> None:
    from funasr import AutoModel
    from funasr.models.fsmn_vad_streaming.model import FsmnVADStreaming

    folder = out / "fsmn_vad"
    config = FSMN_VAD
    model = FsmnVADStreaming(**model_kwargs(config))
    randomize(model, seed=19)
    with torch.no_grad():  # the silence state's share decides the segments; set it where they come and go
        model.encoder.out_linear2.linear.bias[0] = silence_bias
    save_folder(folder, config, model)
    write_am_mvn(folder / "am.mvn", config["frontend_conf"]["n_mels"] * config["frontend_conf"]["lfr_m"], seed=8)

    auto = AutoModel(model=str(folder), device="cpu", disable_update=True, disable_pbar=True, log_level="ERROR")
    golden = {"clips": list(clips), "silence_scores": [], "offline": [], "chunk_ms": VAD_CHUNK_MS, "streaming": []}
    step = VAD_CHUNK_MS * 16
    frontend = auto.kwargs["frontend"]
    for audio in clips.values():
        golden["silence_scores"].append(silence_scores(auto.model, frontend, audio))
        golden["offline"].append(auto.generate(input=audio, disable_pbar=True)[0]["value"])
        cache: dict = {}
        num_chunks = (len(audio) - 1) // step + 1
        events = []
        for index in range(num_chunks):
            result = auto.generate(input=audio[index * step: (index + 1) * step], cache=cache,
                                   is_final=index == num_chunks - 1, chunk_size=VAD_CHUNK_MS, disable_pbar=True)
            events.append(result[0]["value"])
        golden["streaming"].append(events)
    golden["synthetic"] = synthetic_segments(auto.model)
    (out / "fsmn_vad.json").write_text(json.dumps(golden, ensure_ascii=False, indent=1) + "\n")
    print("fsmn_vad:", golden["offline"])


# Hand-made frame runs (speech: silence probability 0.1, silence: 0.9) for FunASR's state machine alone, at its
# configured thresholds: a long pause that ends a segment, a short one that does not, and speech to the last frame.
SYNTHETIC_RUNS = ([(30, 0.9), (120, 0.1), (50, 0.9), (80, 0.1), (150, 0.9), (60, 0.1), (20, 0.9)],
                  [(300, 0.9), (40, 0.1), (100, 0.9), (200, 0.1)],
                  [(10, 0.1), (90, 0.9), (5, 0.1), (40, 0.9)])


def synthetic_segments(model) -> list[dict]:
    """FunASR's ``DetectLastFrames`` on given per-frame silence probabilities (loud frames: decibels at 0)."""
    runs = []
    for run in SYNTHETIC_RUNS:
        silence = [p for count, p in run for _ in range(count)]
        cache = model.init_cache({})
        stats = cache["stats"]
        scores = torch.zeros(1, len(silence), model.encoder.out_linear2.linear.out_features)
        scores[0, :, 0] = torch.tensor(silence)
        scores[0, :, 1] = 1 - scores[0, :, 0]
        stats.scores, stats.frm_cnt, stats.decibel = scores, len(silence), [0.0] * len(silence)
        stats.data_buf_all = torch.zeros((len(silence) - 1) * 160 + 400)
        stats.data_buf = stats.data_buf_all
        model.vad_opts.nn_eval_block_size = len(silence)
        model.DetectLastFrames(cache=cache)
        segments = [[seg.start_ms, seg.end_ms] for seg in stats.output_data_buf]
        runs.append({"silence": [[count, p] for count, p in run], "segments": segments})
    return runs


def silence_scores(model, frontend, audio: np.ndarray) -> dict:
    """The network's silence probability per frame over the whole clip (FunASR's frontend, one encoder pass)."""
    from funasr.utils.load_utils import extract_fbank

    feats, _ = extract_fbank([torch.from_numpy(audio)], data_type="sound", frontend=frontend,
                             cache={}, is_final=True)
    with torch.no_grad():
        scores = model.encoder(feats, cache={})[0, :, 0].numpy().astype(np.float64)
    return {"num_frames": len(scores), "head": np.round(scores[:NUM_SCORE_FRAMES], 6).tolist(),
            "mean": round(float(scores.mean()), 6)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--only", choices=("paraformer_streaming", "fsmn_vad"))
    parser.add_argument("--silence-bias", type=float, default=SILENCE_BIAS)
    args = parser.parse_args()
    clips = read_clips()
    if args.only in (None, "paraformer_streaming"):
        build_paraformer_streaming(args.out, clips)
    if args.only in (None, "fsmn_vad"):
        build_fsmn_vad(args.out, clips, args.silence_bias)


if __name__ == "__main__":
    main()
