"""NeMo's ``model_config.yaml`` -> an OASR architecture and its config, in the transformers field names the
architectures' ``from_dict`` reads. Every value OASR cannot serve is refused here, naming the field.

Which architecture a model becomes follows its ``target`` class and encoder:

- ``EncDecCTCModelBPE`` -> ``parakeet_ctc``;
- ``EncDecRNNTBPEModel`` -> ``parakeet_tdt`` when its decoding (or loss) is TDT with durations, else ``parakeet_rnnt``;
- ``EncDecHybridRNNTCTCBPEModel`` -> the transducer, which is what NeMo decodes a hybrid with by default; the
  auxiliary CTC head (``ctc_decoder.*``) is dropped;
- any of the transducers with a cache-aware streaming encoder (chunked-limited attention, causal subsampling and
  convolutions) -> ``nemotron_asr_streaming``;
- ``EncDecMultiTaskModel`` (Canary) -> ``canary``, as Canary-1B-v2 is built (``nemo_canary``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from oasr.errors import CheckpointError
from oasr.models.converters.nemo_canary import canary
from oasr.models.converters.nemo_yaml import NemoYaml

_CTC = "EncDecCTCModelBPE"
_TRANSDUCERS = ("EncDecRNNTBPEModel", "EncDecHybridRNNTCTCBPEModel")
_MULTITASK = "EncDecMultiTaskModel"
_SAMPLE_RATE = 16_000
# The frontend OASR computes (oasr.features.nemo_logmel): NeMo preprocessor fields and the one value each may take.
_FRONTEND_FIXED = {
    "window": "hann",
    "log": True,
    "frame_splicing": 1,
    "mag_power": 2.0,
    "log_zero_guard_type": "add",
    "mel_norm": "slaney",
    "exact_pad": False,
    "stft_conv": False,
}
_ENCODER_TARGETS = ("nemo.collections.asr.modules.ConformerEncoder",
                    "nemo.collections.asr.modules.conformer_encoder.ConformerEncoder")


@dataclass(frozen=True)
class NemoModel:
    """What a ``.nemo`` config becomes: the architecture, its config dict and the tokenizer member to read."""

    architecture: str
    config: dict[str, Any]
    tokenizer_member: str  # the archive member of the SentencePiece model
    dropped_prefixes: tuple[str, ...]  # state-dict keys under these belong to heads OASR does not run


def map_config(values: dict[str, Any], source: str) -> NemoModel:
    cfg = NemoYaml(values, source)
    target = str(cfg.require("target")).rsplit(".", 1)[-1]
    if target not in (_CTC, *_TRANSDUCERS, _MULTITASK):
        raise cfg.refuse("target", cfg.get("target"), f"{_CTC}, {', '.join(_TRANSDUCERS)}, {_MULTITASK}")
    if target == _MULTITASK:  # named before the tokenizer: Canary-1B and the flash models differ there first
        if cfg.get("prompt_format") != "canary2":
            raise cfg.refuse("prompt_format", cfg.get("prompt_format"), "'canary2', Canary-1B-v2's")
        if cfg.get("tokenizer.type") != "bpe":
            raise cfg.refuse("tokenizer.type", cfg.get("tokenizer.type"), "'bpe': one SentencePiece model holding the "
                             "prompt tokens, as Canary-1B-v2; not the per-language aggregate of the flash models")
    tokenizer_member = _tokenizer_member(cfg)
    frontend = _frontend(cfg)
    streaming = _is_streaming(cfg)
    encoder = _encoder(cfg, streaming)
    vocab_size = _vocab_size(cfg, target)
    if frontend["normalize"] != (not streaming):
        want = "'NA' (none)" if streaming else "'per_feature'"
        raise cfg.refuse("preprocessor.normalize", cfg.get("preprocessor.normalize"), f"{want} for this encoder")
    if target == _MULTITASK:
        if streaming:
            raise cfg.refuse("encoder.att_context_style", cfg.get("encoder.att_context_style"),
                             "an offline encoder for Canary")
        return NemoModel("canary", canary(cfg, encoder, frontend, vocab_size), tokenizer_member, ())
    if target == _CTC:
        if streaming:
            raise cfg.refuse("encoder.att_context_style", cfg.get("encoder.att_context_style"),
                             "cache-aware streaming with RNN-T models only")
        config = {"encoder_config": encoder, "vocab_size": vocab_size + 1, "pad_token_id": vocab_size}
        return NemoModel("parakeet_ctc", config, tokenizer_member, ())
    config, architecture = _transducer(cfg, encoder, vocab_size)
    if streaming:
        if architecture != "parakeet_rnnt":
            raise cfg.refuse("decoding.model_type", cfg.get("decoding.model_type"), "'rnnt' for streaming models")
        architecture = "nemotron_asr_streaming"
    dropped = ("ctc_decoder.",) if target == "EncDecHybridRNNTCTCBPEModel" else ()
    return NemoModel(architecture, config, tokenizer_member, dropped)


def _tokenizer_member(cfg: NemoYaml) -> str:
    cfg.expect("tokenizer.type", ("bpe",))
    model_path = str(cfg.require("tokenizer.model_path"))
    return model_path.removeprefix("nemo:").rsplit("/", 1)[-1]


def _frontend(cfg: NemoYaml) -> dict[str, Any]:
    """The preprocessor's settings, each checked against what OASR's log-mel frontend computes."""
    if cfg.get("preprocessor._target_", "").rsplit(".", 1)[-1] != "AudioToMelSpectrogramPreprocessor":
        raise cfg.refuse("preprocessor._target_", cfg.get("preprocessor._target_"), "AudioToMelSpectrogramPreprocessor")
    rate = cfg.expect("preprocessor.sample_rate", (_SAMPLE_RATE,), _SAMPLE_RATE)
    for field, value in _FRONTEND_FIXED.items():
        cfg.expect(f"preprocessor.{field}", (value,), value)
    cfg.expect("preprocessor.log_zero_guard_value", (2.0**-24,), 2.0**-24)
    win_length = round(float(cfg.get("preprocessor.window_size", 0.02)) * rate)
    hop_length = round(float(cfg.get("preprocessor.window_stride", 0.01)) * rate)
    n_fft = int(cfg.get("preprocessor.n_fft") or 2 ** math.ceil(math.log2(win_length)))
    if (win_length, hop_length, n_fft) != (400, 160, 512):
        raise cfg.refuse("preprocessor.window_size/window_stride/n_fft",
                         (cfg.get("preprocessor.window_size"), cfg.get("preprocessor.window_stride"), n_fft),
                         "0.025 s windows every 0.01 s, 512-point FFT")
    preemphasis = cfg.expect("preprocessor.preemph", (0.97,), 0.97)
    normalize = cfg.expect("preprocessor.normalize", ("per_feature", "NA"), "per_feature")
    return {"feature_size": int(cfg.get("preprocessor.features", 64)), "sampling_rate": rate, "n_fft": n_fft,
            "win_length": win_length, "hop_length": hop_length, "preemphasis": preemphasis,
            "normalize": normalize == "per_feature"}


def _is_streaming(cfg: NemoYaml) -> bool:
    """Whether the encoder is cache-aware (its attention limited to chunks, its convolutions causal); a mix of
    the two kinds is refused."""
    context = cfg.get("encoder.att_context_size", [-1, -1])
    style = cfg.get("encoder.att_context_style", "regular")
    offline = (context in ([-1, -1], [[-1, -1]]) and style == "regular" and not cfg.get("encoder.causal_downsampling")
               and cfg.get("encoder.conv_context_size") in (None, "symmetric"))
    if offline:
        return False
    cfg.expect("encoder.att_context_style", ("chunked_limited",), "regular")
    cfg.expect("encoder.causal_downsampling", (True,), False)
    cfg.expect("encoder.conv_context_size", ("causal",), None)
    return True


def _encoder(cfg: NemoYaml, streaming: bool) -> dict[str, Any]:
    cfg.expect("encoder._target_", _ENCODER_TARGETS)
    cfg.expect("encoder.self_attention_model", ("rel_pos",), "rel_pos")
    cfg.expect("encoder.subsampling", ("dw_striding",))
    cfg.expect("encoder.untie_biases", (True,), True)
    cfg.expect("encoder.feat_out", (-1,), -1)
    cfg.expect("encoder.conv_norm_type", ("layer_norm",) if streaming else ("batch_norm",), "batch_norm")
    cfg.expect("encoder.global_tokens", (0,), 0)
    cfg.expect("encoder.reduction", (None,), None)
    d_model = int(cfg.require("encoder.d_model"))
    channels = int(cfg.get("encoder.subsampling_conv_channels", -1))
    use_bias = bool(cfg.get("encoder.use_bias", True))
    values: dict[str, Any] = {
        "hidden_size": d_model,
        "num_hidden_layers": int(cfg.require("encoder.n_layers")),
        "num_attention_heads": int(cfg.require("encoder.n_heads")),
        "intermediate_size": int(d_model * float(cfg.get("encoder.ff_expansion_factor", 4))),
        "attention_bias": use_bias,
        "convolution_bias": use_bias,
        "conv_kernel_size": int(cfg.get("encoder.conv_kernel_size", 31)),
        "subsampling_factor": int(cfg.get("encoder.subsampling_factor", 4)),
        "subsampling_conv_channels": d_model if channels == -1 else channels,
        "subsampling_conv_kernel_size": int(cfg.get("encoder.subsampling_conv_kernel_size", 3)),
        "subsampling_conv_stride": 2,
        "num_mel_bins": int(cfg.require("encoder.feat_in")),
        "scale_input": bool(cfg.get("encoder.xscaling", True)),
    }
    if cfg.get("preprocessor.features") is not None and int(cfg.get("preprocessor.features")) != values["num_mel_bins"]:
        raise cfg.refuse("encoder.feat_in", values["num_mel_bins"], f"preprocessor.features = {cfg.get('preprocessor.features')}")
    if streaming:
        values.update(_streaming_window(cfg))
    return values


def _streaming_window(cfg: NemoYaml) -> dict[str, Any]:
    """The attention window of a cache-aware encoder. NeMo trains some with several [left, right] contexts and
    runs the first unless told otherwise; OASR serves that one."""
    context = cfg.get("encoder.att_context_size")
    first = context[0] if isinstance(context[0], list) else context
    left, right = (int(v) for v in first)
    if left < 0 or right < 0:
        raise cfg.refuse("encoder.att_context_size", context, "a limited [left, right] window")
    chunk = right + 1
    if left % chunk:
        raise cfg.refuse("encoder.att_context_size", context, "a left context of whole chunks of right + 1 frames")
    # NeMo's streaming loop hands the encoder a stream's last chunk with its real length and decodes only the
    # frames that length gives (oasr.streaming.geometry.TAIL_RULES): the archive's streams end as NeMo's do.
    return {"sliding_window": left + 1, "default_num_lookahead_tokens": right, "stream_tail": "mask"}


def _vocab_size(cfg: NemoYaml, target: str) -> int:
    """The tokenizer's vocabulary (without the blank), as the output layer's width declares it."""
    if target == _CTC:
        return int(cfg.require("decoder.num_classes"))
    if target == _MULTITASK:
        return int(cfg.require("head.num_classes"))
    return int(cfg.require("joint.num_classes"))


def _transducer(cfg: NemoYaml, encoder: dict[str, Any], vocab_size: int) -> tuple[dict[str, Any], str]:
    cfg.expect("decoder.blank_as_pad", (True,), True)
    cfg.expect("decoder.normalization_mode", (None,), None)
    cfg.expect("loss.loss_name", ("default", "tdt"), "default")
    hidden = int(cfg.require("decoder.prednet.pred_hidden"))
    joint_hidden = int(cfg.require("joint.jointnet.joint_hidden"))
    if joint_hidden != hidden:
        raise cfg.refuse("joint.jointnet.joint_hidden", joint_hidden, f"the prediction width ({hidden})")
    config: dict[str, Any] = {
        "encoder_config": encoder,
        "vocab_size": vocab_size + 1,
        "decoder_hidden_size": hidden,
        "num_decoder_layers": int(cfg.get("decoder.prednet.pred_rnn_layers", 1)),
        "hidden_act": cfg.expect("joint.jointnet.activation", ("relu", "silu", "swish", "gelu"), "relu"),
        "max_symbols_per_step": int(cfg.get("decoding.greedy.max_symbols", 10)),
        "blank_token_id": vocab_size,
        "pad_token_id": vocab_size,
    }
    durations = cfg.get("decoding.durations") or cfg.get("loss.tdt_kwargs.durations") or []
    is_tdt = cfg.get("decoding.model_type") == "tdt" or cfg.get("loss.loss_name") == "tdt"
    extra = int(cfg.get("joint.num_extra_outputs", 0))
    if is_tdt:
        if not durations or extra != len(durations):
            raise cfg.refuse("joint.num_extra_outputs", extra, f"one output per TDT duration ({list(durations)})")
        return {**config, "durations": [int(d) for d in durations]}, "parakeet_tdt"
    if extra:
        raise cfg.refuse("joint.num_extra_outputs", extra, "0 for an RNN-T")
    return config, "parakeet_rnnt"
