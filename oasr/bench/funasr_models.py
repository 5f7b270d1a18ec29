"""Random FunASR model folders at published shapes (Paraformer-large, paraformer-zh-streaming, SenseVoice-Small)
written from OASR's side, without funasr: OASR's modules carry FunASR's key names, so OASR's state dict saved as
``model.pt`` beside a ``config.yaml`` in FunASR's layout, an ``am.mvn``, and a token list (``tokens.json``) or
SentencePiece model is a folder both ``oasr`` and funasr's ``AutoModel(model=DIR)`` load.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from oasr.models import ARCHITECTURES

FRONTEND = {"fs": 16000, "window": "hamming", "n_mels": 80, "frame_length": 25, "frame_shift": 10, "lfr_m": 7,
            "lfr_n": 6, "dither": 0.0}
LFR_DIM = FRONTEND["n_mels"] * FRONTEND["lfr_m"]
# FunASR's SenseVoice tags, user-defined pieces of its SentencePiece model (in the published model's order).
SENSE_VOICE_TAGS = ["<|zh|>", "<|en|>", "<|yue|>", "<|ja|>", "<|ko|>", "<|nospeech|>", "<|HAPPY|>", "<|SAD|>",
                    "<|ANGRY|>", "<|NEUTRAL|>", "<|EMO_UNKNOWN|>", "<|Speech|>", "<|BGM|>", "<|Laughter|>",
                    "<|Applause|>", "<|Event_UNK|>", "<|withitn|>", "<|woitn|>"]
SENSE_VOICE_BPE = "chn_jpn_yue_eng_ko_spectok.bpe.model"


@dataclass(frozen=True)
class FunasrShape:
    """A model's size in FunASR's ``*_conf`` terms; the decoder fields are Paraformer's only."""

    model: str  # "Paraformer", "ParaformerStreaming" or "SenseVoiceSmall"
    vocab_size: int
    output_size: int
    linear_units: int
    num_blocks: int
    attention_heads: int = 4
    tp_blocks: int = 0  # SenseVoice's extra encoder layers
    decoder_blocks: int = 0
    decoder_units: int = 0
    decoder_shift: int = 0  # the decoder FSMN's ``sanm_shfit`` (the online model's looks 5 tokens back)


FUNASR_SHAPES = {
    # speech_paraformer-large_asr_nat-zh-cn-16k-common-vocab8404-pytorch (paraformer-zh)
    "paraformer-large": FunasrShape("Paraformer", 8404, 512, 2048, 50, decoder_blocks=16, decoder_units=2048),
    # SenseVoiceSmall: 50 SANM layers + 20 time-pooling ones, a 25,055-piece SentencePiece model
    "sense-voice-small": FunasrShape("SenseVoiceSmall", 25055, 512, 2048, 50, tp_blocks=20),
    "paraformer-tiny": FunasrShape("Paraformer", 60, 32, 48, 2, decoder_blocks=2, decoder_units=48),
    "sense-voice-tiny": FunasrShape("SenseVoiceSmall", 120, 32, 48, 2, tp_blocks=1),
}
# The online Paraformer's shapes (``oasr bench stream`` streams them; the offline bench's FunASR peer has no
# whole-file pass for them).
STREAMING_SHAPES = {
    # speech_paraformer-large_asr_nat-zh-cn-16k-common-vocab8404-online (paraformer-zh-streaming): the offline
    # model's sizes, its decoder's FSMN shifted 5 tokens
    "paraformer-zh-streaming": FunasrShape("ParaformerStreaming", 8404, 512, 2048, 50, decoder_blocks=16,
                                           decoder_units=2048, decoder_shift=5),
    "paraformer-streaming-tiny": FunasrShape("ParaformerStreaming", 60, 32, 48, 2, decoder_blocks=2,
                                             decoder_units=48, decoder_shift=5),
}
# The online encoder's training chunk table, as paraformer-zh-streaming's config.yaml spells it (the chunking a
# stream is served with is chosen per stream: oasr.models.paraformer_streaming.config).
STREAMING_ENCODER = {"chunk_size": [12, 15], "stride": [8, 10], "pad_left": [0, 0],
                     "encoder_att_look_back_factor": [4, 4], "decoder_att_look_back_factor": [1, 1]}


def funasr_config(shape: FunasrShape) -> dict[str, Any]:
    """``config.yaml`` as FunASR's released folders spell it (training-only fields left at their values)."""
    encoder = {"output_size": shape.output_size, "attention_heads": shape.attention_heads,
               "linear_units": shape.linear_units, "num_blocks": shape.num_blocks, "dropout_rate": 0.1,
               "positional_dropout_rate": 0.1, "attention_dropout_rate": 0.1, "input_layer": "pe",
               "pos_enc_class": "SinusoidalPositionEncoder", "normalize_before": True, "kernel_size": 11,
               "sanm_shfit": 0, "selfattention_layer_type": "sanm"}
    if shape.model == "SenseVoiceSmall":
        return {"model": "SenseVoiceSmall",
                "model_conf": {"length_normalized_loss": True, "sos": 1, "eos": 2, "ignore_id": -1},
                "encoder": "SenseVoiceEncoderSmall", "encoder_conf": {**encoder, "tp_blocks": shape.tp_blocks},
                "input_size": LFR_DIM, "frontend": "WavFrontend", "frontend_conf": FRONTEND,
                "tokenizer": "SentencepiecesTokenizer",
                "tokenizer_conf": {"bpemodel": SENSE_VOICE_BPE, "unk_symbol": "<unk>", "split_with_space": True},
                "ctc_conf": {"dropout_rate": 0.0, "ctc_type": "builtin", "reduce": True, "ignore_nan_grad": True}}
    streaming = shape.model == "ParaformerStreaming"
    if streaming:
        encoder = {**encoder, "input_layer": "pe_online", **STREAMING_ENCODER}
    return {"model": shape.model,
            "model_conf": {"ctc_weight": 0.0, "lsm_weight": 0.1, "length_normalized_loss": True,
                           "predictor_weight": 1.0, "predictor_bias": 1, "sampling_ratio": 0.75},
            "encoder": "SANMEncoderChunkOpt" if streaming else "SANMEncoder", "encoder_conf": encoder,
            "decoder": "ParaformerSANMDecoder",
            "decoder_conf": {"attention_heads": shape.attention_heads, "linear_units": shape.decoder_units,
                             "num_blocks": shape.decoder_blocks, "dropout_rate": 0.1, "positional_dropout_rate": 0.1,
                             "self_attention_dropout_rate": 0.1, "src_attention_dropout_rate": 0.1,
                             "att_layer_num": shape.decoder_blocks, "kernel_size": 11,
                             "sanm_shfit": shape.decoder_shift},
            "predictor": "CifPredictorV2",
            "predictor_conf": {"idim": shape.output_size, "threshold": 1.0, "l_order": 1, "r_order": 1,
                               "tail_threshold": 0.45},
            "input_size": LFR_DIM, "frontend": "WavFrontendOnline" if streaming else "WavFrontend",
            "frontend_conf": FRONTEND, "tokenizer": "CharTokenizer",
            "tokenizer_conf": {"unk_symbol": "<unk>", "split_with_space": True}}


def write_am_mvn(path: Path, dim: int, seed: int) -> None:
    """Kaldi nnet1 text with <AddShift> (minus a log-mel mean) and <Rescale> (one over its spread), as FunASR's
    ``load_cmvn`` reads it."""
    rng = np.random.default_rng(seed)

    def row(values: np.ndarray) -> str:
        return " ".join(f"{v:.6f}" for v in values)

    path.write_text(f"<Nnet>\n<Splice> {dim} {dim}\n[ 0 ]\n"
                    f"<AddShift> {dim} {dim}\n<LearnRateCoef> 0 [ {row(-(12.0 + 2.0 * rng.standard_normal(dim)))} ]\n"
                    f"<Rescale> {dim} {dim}\n<LearnRateCoef> 0 [ {row(0.25 + 0.1 * rng.random(dim))} ]\n</Nnet>\n")


def paraformer_tokens(vocab_size: int) -> list[str]:
    """Paraformer-zh's list shape: <blank>, <s>, </s>, then CJK characters, <unk> last."""
    return ["<blank>", "<s>", "</s>", *(chr(0x4E00 + i) for i in range(vocab_size - 4)), "<unk>"]


def write_sense_voice_bpe(path: Path, vocab_size: int, seed: int) -> None:
    """A BPE SentencePiece model of exactly ``vocab_size`` pieces: SenseVoice's tags and filler pieces as
    user-defined symbols, about 100 pieces learnt from a seeded letter corpus."""
    import sentencepiece as spm

    rng = np.random.default_rng(seed)
    letters = list("abcdefghijklmnopqrstuvwxyz")
    words = ["".join(rng.choice(letters, size=int(rng.integers(2, 7)))) for _ in range(300)]
    lines = [" ".join(rng.choice(words, size=10)) for _ in range(2000)]
    learnt = min(100, vocab_size // 2)
    fillers = [f"#{i}" for i in range(max(0, vocab_size - 3 - len(SENSE_VOICE_TAGS) - learnt))]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=model, vocab_size=vocab_size,
                                   model_type="bpe", character_coverage=1.0, minloglevel=2,
                                   user_defined_symbols=SENSE_VOICE_TAGS + fillers, hard_vocab_limit=True)
    path.write_bytes(model.getvalue())


@torch.no_grad()
def write_funasr_folder(arch: str, folder: Path, seed: int = 0) -> Path:
    """A FunASR model folder of ``arch``'s shape with OASR's default-initialised weights. Paraformer's CIF weights
    are set near 0.3 a frame (a token every ~200 ms, as Mandarin speech gives), so the decoder does real work."""
    shape = FUNASR_SHAPES[arch] if arch in FUNASR_SHAPES else STREAMING_SHAPES[arch]
    folder.mkdir(parents=True, exist_ok=True)
    config = funasr_config(shape)
    write_am_mvn(folder / "am.mvn", LFR_DIM, seed=seed + 1)
    if shape.model == "SenseVoiceSmall":
        write_sense_voice_bpe(folder / SENSE_VOICE_BPE, shape.vocab_size, seed)
        (folder / "configuration.json").write_text(json.dumps({
            "framework": "pytorch", "task": "auto-speech-recognition", "model": {"type": "funasr"},
            "file_path_metas": {"init_param": "model.pt", "config": "config.yaml",
                                "tokenizer_conf": {"bpemodel": SENSE_VOICE_BPE},
                                "frontend_conf": {"cmvn_file": "am.mvn"}}}, indent=1) + "\n")
    else:
        tokens = paraformer_tokens(shape.vocab_size)
        (folder / "tokens.json").write_text(json.dumps(tokens, ensure_ascii=False) + "\n", encoding="utf-8")
    (folder / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True))
    cls = ARCHITECTURES.get({"SenseVoiceSmall": "sense_voice", "ParaformerStreaming": "paraformer_streaming"}
                            .get(shape.model, "paraformer"))
    torch.manual_seed(seed)
    model = cls.from_config(cls.config_class.from_dict({**config, "vocab_size": shape.vocab_size}))
    if shape.model != "SenseVoiceSmall":
        model.predictor.cif_output.weight.mul_(0.1)
        model.predictor.cif_output.bias.fill_(float(np.log(0.3 / 0.7)))
    torch.save(model.state_dict(), folder / "model.pt")
    return folder
