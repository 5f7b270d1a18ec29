"""FunASR's model folders: ``config.yaml`` (the model class and its parts' ``*_conf``), ``model.pt`` (a torch state
dict), ``am.mvn`` (Kaldi nnet text holding the CMVN shift and scale) and the token list (``tokens.json``, a JSON
list, or ``tokens.txt``, one token a line), as FunASR's ``AutoModel(model=DIR)`` reads them.

OASR's modules mirror FunASR's key names, so the state dict loads as stored: nothing is renamed, and keys no
module takes (a CTC head that Paraformer's inference never runs, the timestamp branch of SeACo's
``CifPredictorV3``) are reported as dropped. What OASR cannot serve is refused naming the config field: another
model class, encoder, decoder or predictor (BiCif...).

SeACo-Paraformer spells its hotwords through the token list and, when the folder has one, ``seg_dict`` (word ->
tokens, one a line), as FunASR's ``generate_hotwords_list`` does; both go into the checkpoint's config as
``hotword_spelling``.
"""

from __future__ import annotations

import json
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml

from oasr.errors import CheckpointError
from oasr.features.funasr_fbank import WINDOWS
from oasr.models import CONVERTERS
from oasr.models.checkpoint import Checkpoint, ModelSource

CONFIG_FILE = "config.yaml"
WEIGHTS_FILE = "model.pt"
CMVN_FILE = "am.mvn"
TOKEN_FILES = ("tokens.json", "tokens.txt")
SEG_DICT_FILE = "seg_dict"


@dataclass(frozen=True)
class Family:
    """One FunASR model class OASR serves: its architecture and the part classes its config must name."""

    architecture: str
    parts: dict[str, tuple[str, ...]]  # config field -> the class names accepted there
    vocab_key: str  # the weight whose rows are the vocabulary (checked against the token list)
    vocabulary: str = "tokens"  # "tokens": a token list file; "bpe": a SentencePiece model
    required: dict[str, Any] = field(default_factory=dict)  # "section.field" -> the value OASR's modules serve
    frontends: tuple[str, ...] = ("WavFrontend", "wav_frontend")  # the config's ``frontend`` values accepted
    spells_hotwords: bool = False  # the config gets ``hotword_spelling`` (the token list and seg_dict)


# Config values OASR's modules are built for (FunASR's defaults for these families): another value is refused,
# naming the field. A field the config leaves out takes FunASR's default, which is the value here.
FRONTEND_VALUES: dict[str, Any] = {
    "frontend_conf.snip_edges": True,
    "frontend_conf.upsacle_samples": True,  # FunASR's spelling: samples scaled to 16-bit range
}
SANM_VALUES: dict[str, Any] = {
    "encoder_conf.selfattention_layer_type": "sanm",
    "encoder_conf.positionwise_layer_type": "linear",
    "encoder_conf.normalize_before": True,
    "encoder_conf.concat_after": False,
}
# SenseVoice's encoder reads none of these: its layers are always pre-norm SANM over sinusoid positions.
PARAFORMER_VALUES: dict[str, Any] = {
    **FRONTEND_VALUES, **SANM_VALUES,
    "encoder_conf.input_layer": "pe",
    "decoder_conf.input_layer": "embed",
    "decoder_conf.normalize_before": True,
    "decoder_conf.concat_after": False,
}

# The online Paraformer: the same modules, its encoder chunked (positions counted over the stream) and its
# frontend FunASR's online one, whose frames equal the offline frontend's (oasr.models.paraformer_streaming).
STREAMING_PARAFORMER_VALUES: dict[str, Any] = {**PARAFORMER_VALUES, "encoder_conf.input_layer": "pe_online"}

# FunASR's Conformer as its released configs build it (oasr.models.funasr_conformer): conv2d subsampling, the
# legacy relative positions ``rel_pos`` means while ``rel_pos_type`` keeps its default, pre-norm swish blocks.
CONFORMER_VALUES: dict[str, Any] = {
    **FRONTEND_VALUES,
    "encoder_conf.input_layer": "conv2d",
    "encoder_conf.pos_enc_layer_type": "rel_pos",
    "encoder_conf.selfattention_layer_type": "rel_selfattn",
    "encoder_conf.rel_pos_type": "legacy",
    "encoder_conf.activation_type": "swish",
    "encoder_conf.positionwise_layer_type": "linear",
    "encoder_conf.normalize_before": True,
    "encoder_conf.concat_after": False,
    "encoder_conf.zero_triu": False,
    "decoder_conf.input_layer": "embed",
    "decoder_conf.normalize_before": True,
    "decoder_conf.concat_after": False,
    "model_conf.share_embedding": False,
}

# SeACo-Paraformer: the Paraformer's values, an LSTM bias encoder running forward only (OASR's model takes its
# last step as a hotword's embedding) and a seaco decoder that ends in hidden states (FunASR's inference adds the
# two attended outputs before its own hotword head; an output layer there would not fit it).
SEACO_VALUES: dict[str, Any] = {
    **PARAFORMER_VALUES,
    "model_conf.bias_encoder_type": "lstm",
    "model_conf.bias_encoder_bid": False,
    "seaco_decoder_conf.use_output_layer": False,
    "seaco_decoder_conf.normalize_before": True,
    "seaco_decoder_conf.concat_after": False,
}

FAMILIES = {
    "Paraformer": Family("paraformer", {"encoder": ("SANMEncoder",), "decoder": ("ParaformerSANMDecoder",),
                                        "predictor": ("CifPredictorV2",)}, "decoder.output_layer.weight",
                         required=PARAFORMER_VALUES),
    "ParaformerStreaming": Family("paraformer_streaming", {"encoder": ("SANMEncoderChunkOpt",),
                                                           "decoder": ("ParaformerSANMDecoder",),
                                                           "predictor": ("CifPredictorV2",)},
                                  "decoder.output_layer.weight", required=STREAMING_PARAFORMER_VALUES,
                                  frontends=("WavFrontendOnline",)),
    # The released SeACo folders time tokens with CifPredictorV3, whose token path is CifPredictorV2's.
    "SeacoParaformer": Family("seaco_paraformer", {"encoder": ("SANMEncoder",), "decoder": ("ParaformerSANMDecoder",),
                                                   "predictor": ("CifPredictorV2", "CifPredictorV3"),
                                                   "seaco_decoder": ("ParaformerSANMDecoder",)},
                              "decoder.output_layer.weight", required=SEACO_VALUES, spells_hotwords=True),
    "SenseVoiceSmall": Family("sense_voice", {"encoder": ("SenseVoiceEncoderSmall",)}, "ctc.ctc_lo.weight", "bpe",
                              required=FRONTEND_VALUES),
    "Conformer": Family("funasr_conformer", {"encoder": ("ConformerEncoder",), "decoder": ("TransformerDecoder",)},
                        "ctc.ctc_lo.weight", required=CONFORMER_VALUES),
}


@CONVERTERS.register("funasr")
class FunasrConverter:
    @staticmethod
    def detect(source: ModelSource) -> bool:
        return (source.archive is None and (source.directory / CONFIG_FILE).is_file()
                and (source.directory / WEIGHTS_FILE).is_file())

    @staticmethod
    def load(source: ModelSource) -> Checkpoint:
        config = read_config(source)
        family = family_of(config, source)
        tags: dict[str, int] = {}
        extra: dict[str, Any] = {}
        if family.vocabulary == "bpe":
            tokens_file = bpe_file(config, source)
            vocab_size, tags = bpe_vocabulary(tokens_file, source)
        else:
            tokens_file = token_file(source)
            tokens = read_tokens(tokens_file, source)
            vocab_size = len(tokens)
            if family.spells_hotwords:
                extra["hotword_spelling"] = hotword_spelling(config, tokens, source)
        stated = int(config.get("vocab_size") or 0)
        if stated > 0 and stated != vocab_size:
            raise CheckpointError(f"{source}: config.yaml says vocab_size {stated} but {tokens_file.name} "
                                  f"holds {vocab_size} tokens")
        frontend = dict(config.get("frontend_conf") or {})
        cmvn = source.directory / CMVN_FILE
        if cmvn.is_file():
            frontend["cmvn_shift"], frontend["cmvn_scale"] = read_cmvn(cmvn, source)
        state = read_weights(source)
        rows = state[family.vocab_key].shape[0] if family.vocab_key in state else None
        if rows is not None and rows != vocab_size:
            raise CheckpointError(f"{source}: {WEIGHTS_FILE} scores {rows} tokens ({family.vocab_key}) but "
                                  f"{tokens_file.name} holds {vocab_size}")
        # FunASR writes the text of a model whose predictor times tokens (CifPredictorV3) as it writes timed text.
        timed = family.spells_hotwords and config.get("predictor") == "CifPredictorV3"
        return Checkpoint(
            architecture=family.architecture,
            config={**config, "frontend_conf": frontend, "vocab_size": vocab_size, "tag_token_ids": tags, **extra},
            state_dict=state,
            tokenizer_file=tokens_file,
            format="funasr",
            tokenizer="funasr_tokens_timed" if timed else None,
        )


def read_config(source: ModelSource) -> dict[str, Any]:
    path = source.directory / CONFIG_FILE
    try:
        values = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{source}: {CONFIG_FILE} is not valid YAML: {exc}") from None
    if not isinstance(values, dict):
        raise CheckpointError(f"{source}: {CONFIG_FILE} is not a mapping")
    return values


def family_of(config: dict[str, Any], source: ModelSource) -> Family:
    """The family ``config['model']`` names, its parts checked; anything else is refused by field."""
    name = config.get("model")
    family = FAMILIES.get(str(name))
    if family is None:
        raise CheckpointError(f"{source}: {CONFIG_FILE} field model is {name!r}; OASR serves FunASR's "
                              f"{', '.join(FAMILIES)}")
    for part, accepted in family.parts.items():
        if config.get(part) not in accepted:
            raise CheckpointError(f"{source}: {CONFIG_FILE} field {part} is {config.get(part)!r}; OASR's "
                                  f"{family.architecture} serves {', '.join(accepted)}")
    frontend = config.get("frontend", family.frontends[0])
    if frontend not in family.frontends:
        raise CheckpointError(f"{source}: {CONFIG_FILE} field frontend is {frontend!r}; OASR's "
                              f"{family.architecture} serves {family.frontends[0]}")
    window = (config.get("frontend_conf") or {}).get("window", "hamming")
    if window not in WINDOWS:
        raise CheckpointError(f"{source}: {CONFIG_FILE} field frontend_conf.window is {window!r}; OASR serves "
                              f"{', '.join(WINDOWS)}")
    for path, required in family.required.items():
        section, name = path.split(".")
        value = (config.get(section) or {}).get(name, required)
        if value != required:
            raise CheckpointError(f"{source}: {CONFIG_FILE} field {path} is {value!r}; OASR serves {required!r}")
    return family


def token_file(source: ModelSource) -> Path:
    for name in TOKEN_FILES:
        if (source.directory / name).is_file():
            return source.directory / name
    raise CheckpointError(f"{source}: no token list ({' or '.join(TOKEN_FILES)}) beside {CONFIG_FILE}")


def bpe_file(config: dict[str, Any], source: ModelSource) -> Path:
    """The SentencePiece model: as ``configuration.json`` names it (SenseVoice-Small's folder), else as
    ``tokenizer_conf.bpemodel`` does, else ``bpe.model`` or the one ``*.bpe.model`` beside the config."""
    names = []
    metas = source.directory / "configuration.json"
    if metas.is_file():
        try:
            names.append(json.loads(metas.read_text(encoding="utf-8"))["file_path_metas"]["tokenizer_conf"]["bpemodel"])
        except (json.JSONDecodeError, KeyError, TypeError):
            pass
    names.append((config.get("tokenizer_conf") or {}).get("bpemodel"))
    names.append("bpe.model")
    for name in names:
        if isinstance(name, str) and (source.directory / Path(name).name).is_file():
            return source.directory / Path(name).name
    found = sorted(source.directory.glob("*.bpe.model"))
    if len(found) == 1:
        return found[0]
    raise CheckpointError(f"{source}: no SentencePiece model (configuration.json's tokenizer_conf.bpemodel, "
                          "bpe.model or one *.bpe.model) beside config.yaml")


def bpe_vocabulary(path: Path, source: ModelSource) -> tuple[int, dict[str, int]]:
    """The SentencePiece model's size and the ids of its ``<|...|>`` tag pieces (SenseVoice's languages,
    emotions, events and ITN marks), by piece."""
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor()
    try:
        processor.Load(str(path))
    except (OSError, RuntimeError) as exc:
        raise CheckpointError(f"{source}: {path.name} is not a SentencePiece model: {exc}") from None
    size = processor.GetPieceSize()
    pieces = (processor.IdToPiece(i) for i in range(size))
    return size, {piece: i for i, piece in enumerate(pieces) if piece.startswith("<|") and piece.endswith("|>")}


def read_tokens(path: Path, source: ModelSource | str) -> list[str]:
    """The token list, index = token id: a JSON list (tokens.json) or one token a line (tokens.txt)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{source}: cannot read {path.name}: {exc}") from None
    if path.suffix == ".json":
        try:
            tokens = json.loads(text)
        except json.JSONDecodeError as exc:
            raise CheckpointError(f"{source}: {path.name} is not valid JSON: {exc}") from None
    else:
        tokens = [line.split()[0] if line.split() else line for line in text.splitlines()]
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
        raise CheckpointError(f"{source}: {path.name} is not a non-empty list of token strings")
    return tokens


def hotword_spelling(config: dict[str, Any], tokens: list[str], source: ModelSource) -> dict[str, Any]:
    """The token list, the folder's seg_dict (None without one) and the unknown-word token, for
    ``oasr.models.seaco_paraformer.hotwords.HotwordSpelling``."""
    unk = (config.get("tokenizer_conf") or {}).get("unk_symbol", "<unk>")
    if unk not in tokens:
        raise CheckpointError(f"{source}: the token list has no {unk!r} (tokenizer_conf.unk_symbol), which "
                              "hotwords it cannot spell become")
    if len(set(tokens)) != len(tokens):
        raise CheckpointError(f"{source}: the token list repeats a token")
    path = source.directory / SEG_DICT_FILE
    return {"tokens": tokens, "seg_dict": read_seg_dict(path, source) if path.is_file() else None, "unk": unk}


def read_seg_dict(path: Path, source: ModelSource) -> dict[str, list[str]]:
    """seg_dict: ``word token token ...`` a line (FunASR keeps the last line of a repeated word)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{source}: cannot read {SEG_DICT_FILE}: {exc}") from None
    return {fields[0]: fields[1:] for fields in (line.split() for line in lines) if fields}


def read_cmvn(path: Path, source: ModelSource) -> tuple[list[float], list[float]]:
    """am.mvn's shift and scale: the bracketed values on the line after ``<AddShift>`` and ``<Rescale>``."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found: dict[str, list[float]] = {}
    for index, line in enumerate(lines[:-1]):
        head = line.split()[:1]
        if head and head[0] in ("<AddShift>", "<Rescale>"):
            values = lines[index + 1].split()
            if values[:1] != ["<LearnRateCoef>"] or "[" not in values or values[-1] != "]":
                raise CheckpointError(f"{source}: {CMVN_FILE}: no bracketed values after {head[0]}")
            try:
                found[head[0]] = [float(v) for v in values[values.index("[") + 1:-1]]
            except ValueError as exc:
                raise CheckpointError(f"{source}: {CMVN_FILE}: {exc}") from None
    missing = [name for name in ("<AddShift>", "<Rescale>") if name not in found]
    if missing:
        raise CheckpointError(f"{source}: {CMVN_FILE} has no {' or '.join(missing)}")
    return found["<AddShift>"], found["<Rescale>"]


def read_weights(source: ModelSource) -> dict[str, torch.Tensor]:
    path = source.directory / WEIGHTS_FILE
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError) as exc:
        raise CheckpointError(f"{source}: {WEIGHTS_FILE} is not a torch state dict: {exc}") from None
    for wrapper in ("state_dict", "model_state_dict", "model"):  # the wrappers FunASR's loader unwraps
        if isinstance(state, dict) and isinstance(state.get(wrapper), dict):
            state = state[wrapper]
    if not isinstance(state, dict):
        raise CheckpointError(f"{source}: {WEIGHTS_FILE} is not a state dict")
    return {k.removeprefix("module."): v for k, v in state.items() if isinstance(v, torch.Tensor)}
