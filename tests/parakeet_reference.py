"""Tiny random transformers Parakeet models (CTC, RNN-T, TDT) built from OASR's tiny configs, and their own
greedy decoding, for the FastConformer parity tests.

Default initialisation (std 0.02) makes every frame look alike, so decoding degenerates (all blank, or one token
repeated); ``randomize`` gives the weights unit-gain scales and calibrates the heads so the reference emits a mix
of blanks and different tokens, which is what lets a parity test fail.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from oasr.models import ARCHITECTURES

KINDS = ("ctc", "rnnt", "tdt")
FEATURE_LENGTHS = (160, 97, 41)  # feature frames of the test batch: 20, 13 and 6 encoder frames
_CLASSES = {
    "ctc": (transformers.ParakeetCTCConfig, transformers.ParakeetForCTC),
    "rnnt": (transformers.ParakeetRNNTConfig, transformers.ParakeetForRNNT),
    "tdt": (transformers.ParakeetTDTConfig, transformers.ParakeetForTDT),
}
# Per kind: (seed, blank logit bias, duration-0 logit penalty); chosen so the reference output is varied.
_CALIBRATION = {"ctc": (0, 1.0, 0.0), "rnnt": (0, 3.0, 0.0), "tdt": (3, 2.0, 1.0)}
_PIECES = ["<unk>", "\u2581the", "\u2581a", "\u2581cat", "\u2581dog", "\u2581is", "\u2581on", "\u2581in", "\u2581",
           "s", "t", "e", "a", "o", "n", "r", "i", "l", "d", "c", "g", "h", "m", "u", "p", "b", "y", "w", "f", "k",
           ".", ","]  # fmt: skip


def features(num_mel_bins: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random normalised features, zero-padded as the extractor pads -> ([B, T, n_mels], lengths [B])."""
    lengths = torch.tensor(FEATURE_LENGTHS)
    x = torch.randn(len(lengths), max(FEATURE_LENGTHS), num_mel_bins, generator=torch.Generator().manual_seed(seed))
    return x * (torch.arange(x.shape[1])[None, :, None] < lengths[:, None, None]), lengths


def attention_mask(lengths: torch.Tensor) -> torch.Tensor:
    return (torch.arange(int(lengths.max()))[None, :] < lengths[:, None]).long()


def build_reference(kind: str) -> torch.nn.Module:
    """A transformers Parakeet model with OASR's tiny config for ``kind``, randomized and calibrated."""
    config = ARCHITECTURES.get(f"parakeet_{kind}").tiny_config()
    values = config.to_dict()
    values.pop("model_type")
    extra = {} if kind == "ctc" else {"decoder_start_token_id": config.blank_id}
    config_cls, model_cls = _CLASSES[kind]
    seed, blank_bias, zero_duration_penalty = _CALIBRATION[kind]
    torch.manual_seed(seed)
    model = model_cls(config_cls(**values, **extra)).eval()
    randomize(model, kind, blank_bias, zero_duration_penalty)
    return model


@torch.no_grad()
def randomize(model: torch.nn.Module, kind: str, blank_bias: float, zero_duration_penalty: float,
              calibration: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    """``calibration``: the (features [B, T, n_mels], lengths [B]) the joint is centred on; default ``features``."""
    randomize_weights(model)
    calibrate_heads(model, kind, blank_bias, zero_duration_penalty, calibration)


@torch.no_grad()
def randomize_weights(model: torch.nn.Module) -> None:
    """Unit-gain random weights, perturbed norms and biases, and real batch-norm running statistics."""
    for name, p in model.named_parameters():
        if p.dim() >= 2:
            p.normal_(0.0, p[0].numel() ** -0.5)
        elif "norm" in name:
            p.add_(0.1 * torch.randn_like(p))
        elif "bias" in name:
            p.normal_(0.0, 0.1)
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm1d):  # real running statistics, so inference BN is exercised
            module.running_mean.normal_(0.0, 0.1)
            module.running_var.uniform_(0.5, 1.5)


@torch.no_grad()
def calibrate_heads(model: torch.nn.Module, kind: str, blank_bias: float, zero_duration_penalty: float,
                    calibration: tuple[torch.Tensor, torch.Tensor] | None = None, **inputs) -> None:
    """Biases the blank; for transducers, centres and scales the joint's encoder side on ``calibration``
    (``inputs``: more inputs of ``get_audio_features`` for that batch, as Nemotron 3.5's ``prompt_ids``)."""
    config = model.config
    if kind == "ctc":
        model.ctc_head.bias[config.pad_token_id] += blank_bias
        return
    # Centre and scale the encoder side of the joint so frames, not the predictor's constant offset, decide.
    x, lengths = calibration or features(config.encoder_config.num_mel_bins)
    out = model.get_audio_features(input_features=x, attention_mask=attention_mask(lengths), **inputs)
    frames = out.pooler_output[out.attention_mask.bool()]
    model.encoder_projector.bias.sub_(frames.mean(0))
    gain = 2.0 / frames.std(0)
    model.encoder_projector.weight.mul_(gain[:, None])
    model.encoder_projector.bias.mul_(gain)
    model.decoder.decoder_projector.weight.mul_(0.5)
    model.joint.head.bias[config.blank_token_id] += blank_bias
    if kind == "tdt":
        model.joint.head.bias[config.vocab_size] -= zero_duration_penalty


@dataclass
class ReferenceDecoding:
    ids: list[list[int]]  # tokens per row, blanks dropped (and CTC repeats merged)
    sequences: torch.Tensor  # generate's raw output
    steps: list[list[int]]  # transducers: every label step of each row inside its frames, blanks included
    durations: list[list[int]]  # transducers: frames advanced at each of those steps


@torch.no_grad()
def reference_greedy(kind: str, model: torch.nn.Module, x: torch.Tensor, lengths: torch.Tensor) -> ReferenceDecoding:
    """transformers' own greedy decoding.

    CTC: ``generate`` (frame argmax, padded frames set to the pad/blank id), then the tokenizer's collapse: merge
    repeats, drop the blank. Transducers: ``generate`` keeps stepping rows whose frames are exhausted (it has no
    EOS to stop them), so each row is cut where its frame pointer passes its encoder length, and blanks dropped.
    """
    mask = attention_mask(lengths)
    config = model.config
    if kind == "ctc":
        sequences = model.generate(input_features=x, attention_mask=mask)
        blank = config.pad_token_id
        ids = [[t for t, _ in itertools.groupby(row.tolist()) if t != blank] for row in sequences]
        return ReferenceDecoding(ids, sequences, [], [])
    encoder_lengths = model.get_audio_features(input_features=x, attention_mask=mask).attention_mask.sum(-1)
    extra = {"max_new_tokens": int(encoder_lengths.max()) * config.max_symbols_per_step + 1}
    if kind == "tdt":
        # generate picks the next token by argmax over all joint outputs, durations included; keep it on tokens.
        extra["suppress_tokens"] = list(range(config.vocab_size, config.vocab_size + len(config.durations)))
    out = model.generate(input_features=x, attention_mask=mask, **extra)
    steps, advances = [], []
    for row, durations, length in zip(out.sequences, out.durations, encoder_lengths, strict=True):
        frame = torch.cumsum(durations, 0) - durations  # the frame each step was taken at
        inside = [i for i in range(1, len(row)) if frame[i] < length]  # step 0 is the start token
        steps.append([int(row[i]) for i in inside])
        advances.append([int(durations[i]) for i in inside])
    ids = [[t for t in row if t != config.blank_token_id] for row in steps]
    return ReferenceDecoding(ids, out.sequences, steps, advances)


def write_tokenizer(path: Path, special: str) -> Path:
    """A SentencePiece-style (Metaspace) unigram vocabulary of 33 ids; ``special`` (the blank) is id 32."""
    tok = Tokenizer(models.Unigram([(piece, -float(i)) for i, piece in enumerate(_PIECES)], unk_id=0))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.add_special_tokens(["<unk>", special])
    assert tok.token_to_id(special) == len(_PIECES) == 32
    tok.save(str(path))
    return path


def reference_tokenizer(path: Path, special: str):
    return transformers.ParakeetTokenizer(tokenizer_file=str(path), unk_token="<unk>", pad_token=special)
