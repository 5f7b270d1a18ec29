"""The tiny FunASR configurations of tests/data/funasr/, in FunASR's ``config.yaml`` layout, and the files a model
folder holds beside them (``tokens.json``, ``am.mvn``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

FRONTEND = {"fs": 16000, "window": "hamming", "n_mels": 80, "frame_length": 25, "frame_shift": 10, "lfr_m": 7,
            "lfr_n": 6, "dither": 0.0}

# Paraformer-zh's layout at a tiny size: SANM encoder (first layer reads the 560-wide LFR frames), CIF predictor
# with its tail threshold, SANM decoder with one layer past the cross-attention ones (decoders2) and decoders3.
PARAFORMER = {
    "model": "Paraformer",
    "model_conf": {"ctc_weight": 0.0, "lsm_weight": 0.1, "length_normalized_loss": True, "predictor_weight": 1.0,
                   "predictor_bias": 1, "sampling_ratio": 0.75},
    "encoder": "SANMEncoder",
    "encoder_conf": {"output_size": 40, "attention_heads": 4, "linear_units": 64, "num_blocks": 3,
                     "dropout_rate": 0.1, "positional_dropout_rate": 0.1, "attention_dropout_rate": 0.1,
                     "input_layer": "pe", "pos_enc_class": "SinusoidalPositionEncoder", "normalize_before": True,
                     "kernel_size": 11, "sanm_shfit": 0, "selfattention_layer_type": "sanm"},
    "decoder": "ParaformerSANMDecoder",
    "decoder_conf": {"attention_heads": 4, "linear_units": 64, "num_blocks": 3, "dropout_rate": 0.1,
                     "positional_dropout_rate": 0.1, "self_attention_dropout_rate": 0.1,
                     "src_attention_dropout_rate": 0.1, "att_layer_num": 2, "kernel_size": 11, "sanm_shfit": 0},
    "predictor": "CifPredictorV2",
    "predictor_conf": {"idim": 40, "threshold": 1.0, "l_order": 1, "r_order": 1, "tail_threshold": 0.45},
    "input_size": 560,
    "frontend": "WavFrontend",
    "frontend_conf": FRONTEND,
    "tokenizer": "CharTokenizer",
    "tokenizer_conf": {"unk_symbol": "<unk>", "split_with_space": True},
}

# Real Paraformer-zh vocabularies start with <blank>, <s>, </s> and end with <unk>; between them Chinese
# characters, whole English words and BPE pieces that continue into the next token (``@@``).
TOKENS = ["<blank>", "<s>", "</s>",
          *"的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年",
          "the", "and", "of", "to", "a", "in", "that", "is", "was", "he", "it", "you",
          "th@@", "ing", "re@@", "er", "un@@", "ed", "in@@", "s", "co@@", "ly", "o@@", "n",
          "1", "2", "3", "<unk>"]


def write_tokens(path: Path) -> list[str]:
    path.write_text(json.dumps(TOKENS, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    return TOKENS


def write_am_mvn(path: Path, dim: int, seed: int) -> None:
    """Kaldi nnet1 text with an <AddShift> (minus a log-mel mean) and a <Rescale> (one over its spread), the
    layout FunASR's ``load_cmvn`` reads: values between ``[`` and ``]`` on the line after each component."""
    rng = np.random.default_rng(seed)
    shift = -(12.0 + 2.0 * rng.standard_normal(dim))
    scale = 0.25 + 0.1 * rng.random(dim)

    def row(values: np.ndarray) -> str:
        return " ".join(f"{v:.6f}" for v in values)

    path.write_text(
        "<Nnet>\n"
        f"<Splice> {dim} {dim}\n[ 0 ]\n"
        f"<AddShift> {dim} {dim}\n<LearnRateCoef> 0 [ {row(shift)} ]\n"
        f"<Rescale> {dim} {dim}\n<LearnRateCoef> 0 [ {row(scale)} ]\n"
        "</Nnet>\n"
    )

# SenseVoice-Small's layout at a tiny size: the SANM encoder (encoders0, encoders, after_norm) followed by the
# "time-pooling" blocks (tp_encoders, tp_norm) and a CTC head; the four query embeddings (language, event,
# emotion, ITN) are rows of ``embed``.
SENSE_VOICE = {
    "model": "SenseVoiceSmall",
    "model_conf": {"length_normalized_loss": True, "sos": 1, "eos": 2, "ignore_id": -1},
    "encoder": "SenseVoiceEncoderSmall",
    "encoder_conf": {"output_size": 40, "attention_heads": 4, "linear_units": 64, "num_blocks": 3, "tp_blocks": 2,
                     "dropout_rate": 0.1, "positional_dropout_rate": 0.1, "attention_dropout_rate": 0.1,
                     "input_layer": "pe", "pos_enc_class": "SinusoidalPositionEncoder", "normalize_before": True,
                     "kernel_size": 11, "sanm_shfit": 0, "selfattention_layer_type": "sanm"},
    "input_size": 560,
    "frontend": "WavFrontend",
    "frontend_conf": FRONTEND,
    "tokenizer": "SentencepiecesTokenizer",
    "tokenizer_conf": {"bpemodel": None, "unk_symbol": "<unk>", "split_with_space": True},
    "ctc_conf": {"dropout_rate": 0.0, "ctc_type": "builtin", "reduce": True, "ignore_nan_grad": True},
}
SENSE_VOICE_BPE = "chn_jpn_yue_eng_ko_spectok.bpe.model"  # the name SenseVoice-Small's folder ships it under
# SenseVoice's tags, user-defined pieces of its SentencePiece model (written out as text when decoded).
SENSE_VOICE_TAGS = ["<|zh|>", "<|en|>", "<|yue|>", "<|ja|>", "<|ko|>", "<|nospeech|>", "<|HAPPY|>", "<|SAD|>",
                    "<|ANGRY|>", "<|NEUTRAL|>", "<|EMO_UNKNOWN|>", "<|Speech|>", "<|BGM|>", "<|Laughter|>",
                    "<|Applause|>", "<|Event_UNK|>", "<|withitn|>", "<|woitn|>"]


def write_sense_voice_bpe(path: Path, seed: int) -> None:
    """A small BPE SentencePiece model with SenseVoice's tags as user-defined pieces, trained on words."""
    import io

    import sentencepiece as spm

    rng = np.random.default_rng(seed)
    words = ["the", "and", "speech", "voice", "hello", "world", "sense", "model", "listen", "again", "three",
             "seven", "north", "wind", "sun", "你好", "世界", "语音", "识别", "今天", "天气", "很好", "我们", "中国"]
    lines = [" ".join(rng.choice(words, size=8)) for _ in range(400)]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=model, vocab_size=90,
                                   model_type="bpe", character_coverage=1.0, user_defined_symbols=SENSE_VOICE_TAGS,
                                   minloglevel=2)
    path.write_bytes(model.getvalue())

# FunASR's online WavFrontend for the streaming models: the same fbank and LFR, kept across chunks.
FRONTEND_ONLINE = dict(FRONTEND)

# paraformer-zh-streaming's layout at a tiny size: the chunked SANM encoder (chunk sizes and strides in LFR
# frames, as the released config lists them), the offline decoder with a look-ahead shift of 5 in its FSMN memory,
# and the same CIF predictor run chunk by chunk.
PARAFORMER_STREAMING = {
    "model": "ParaformerStreaming",
    "model_conf": dict(PARAFORMER["model_conf"]),
    "encoder": "SANMEncoderChunkOpt",
    "encoder_conf": {**PARAFORMER["encoder_conf"], "input_layer": "pe_online", "chunk_size": [12, 15],
                     "stride": [8, 10], "pad_left": [0, 0], "encoder_att_look_back_factor": [4, 4],
                     "decoder_att_look_back_factor": [1, 1]},
    "decoder": "ParaformerSANMDecoder",
    "decoder_conf": {**PARAFORMER["decoder_conf"], "sanm_shfit": 5},
    "predictor": "CifPredictorV2",
    "predictor_conf": dict(PARAFORMER["predictor_conf"]),
    "input_size": 560,
    "frontend": "WavFrontendOnline",
    "frontend_conf": FRONTEND_ONLINE,
    "tokenizer": "CharTokenizer",
    "tokenizer_conf": dict(PARAFORMER["tokenizer_conf"]),
}

# fsmn-vad's layout at a tiny size: 5-frame LFR of 80 mel bins in, FSMN blocks with a left memory of 20 frames,
# 248 output states of which state 0 is silence; the segment logic's settings are the released model's.
FSMN_VAD = {
    "model": "FsmnVADStreaming",
    "model_conf": {"sample_rate": 16000, "detect_mode": 1, "snr_mode": 0, "max_end_silence_time": 800,
                   "max_start_silence_time": 3000, "do_start_point_detection": True,
                   "do_end_point_detection": True, "window_size_ms": 200, "sil_to_speech_time_thres": 150,
                   "speech_to_sil_time_thres": 150, "speech_2_noise_ratio": 1.0, "do_extend": 1,
                   "lookback_time_start_point": 200, "lookahead_time_end_point": 100,
                   "max_single_segment_time": 60000, "snr_thres": -100.0, "noise_frame_num_used_for_snr": 100,
                   "decibel_thres": -100.0, "speech_noise_thres": 0.6, "fe_prior_thres": 0.0001,
                   "silence_pdf_num": 1, "sil_pdf_ids": [0], "speech_noise_thresh_low": -0.1,
                   "speech_noise_thresh_high": 0.3, "output_frame_probs": False, "frame_in_ms": 10,
                   "frame_length_ms": 25},
    "encoder": "FSMN",
    "encoder_conf": {"input_dim": 400, "input_affine_dim": 32, "fsmn_layers": 2, "linear_dim": 48, "proj_dim": 24,
                     "lorder": 20, "rorder": 0, "lstride": 1, "rstride": 0, "output_affine_dim": 32,
                     "output_dim": 248},
    "frontend": "WavFrontendOnline",
    "frontend_conf": {"fs": 16000, "window": "hamming", "n_mels": 80, "frame_length": 25, "frame_shift": 10,
                      "dither": 0.0, "lfr_m": 5, "lfr_n": 1},
}
