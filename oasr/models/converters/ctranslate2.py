"""CTranslate2 Whisper checkpoints (``model.bin`` + ``config.json`` + ``tokenizer.json``) -> HF key layout.

CTranslate2 fuses projections (self-attention Q|K|V, cross-attention K|V) and stores a zero K bias where Whisper
has none; the table below renames every variable, and ``_split`` undoes the fusions.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import torch

from oasr.errors import CheckpointError
from oasr.models import CONVERTERS
from oasr.models.checkpoint import Checkpoint, ModelSource, require_file
from oasr.models.converters.ct2_format import read_ct2_model

# (CTranslate2 name pattern, HF name template or a tuple of templates for a fused tensor split in equal parts).
_RENAMES: list[tuple[str, str | tuple[str, ...]]] = [
    (r"encoder/conv(\d)/(weight|bias)", "model.encoder.conv{0}.{1}"),
    (r"encoder/position_encodings/encodings", "model.encoder.embed_positions.weight"),
    (r"(encoder|decoder)/layer_norm/gamma", "model.{0}.layer_norm.weight"),
    (r"(encoder|decoder)/layer_norm/beta", "model.{0}.layer_norm.bias"),
    (r"decoder/embeddings/weight", "model.decoder.embed_tokens.weight"),
    (r"decoder/position_encodings/encodings", "model.decoder.embed_positions.weight"),
    (r"(encoder|decoder)/layer_(\d+)/self_attention/layer_norm/gamma", "model.{0}.layers.{1}.self_attn_layer_norm.weight"),
    (r"(encoder|decoder)/layer_(\d+)/self_attention/layer_norm/beta", "model.{0}.layers.{1}.self_attn_layer_norm.bias"),
    (
        r"(encoder|decoder)/layer_(\d+)/self_attention/linear_0/(weight|bias)",
        (
            "model.{0}.layers.{1}.self_attn.q_proj.{2}",
            "model.{0}.layers.{1}.self_attn.k_proj.{2}",
            "model.{0}.layers.{1}.self_attn.v_proj.{2}",
        ),
    ),
    (r"(encoder|decoder)/layer_(\d+)/self_attention/linear_1/(weight|bias)", "model.{0}.layers.{1}.self_attn.out_proj.{2}"),
    (r"decoder/layer_(\d+)/attention/layer_norm/gamma", "model.decoder.layers.{0}.encoder_attn_layer_norm.weight"),
    (r"decoder/layer_(\d+)/attention/layer_norm/beta", "model.decoder.layers.{0}.encoder_attn_layer_norm.bias"),
    (r"decoder/layer_(\d+)/attention/linear_0/(weight|bias)", "model.decoder.layers.{0}.encoder_attn.q_proj.{1}"),
    (
        r"decoder/layer_(\d+)/attention/linear_1/(weight|bias)",
        ("model.decoder.layers.{0}.encoder_attn.k_proj.{1}", "model.decoder.layers.{0}.encoder_attn.v_proj.{1}"),
    ),
    (r"decoder/layer_(\d+)/attention/linear_2/(weight|bias)", "model.decoder.layers.{0}.encoder_attn.out_proj.{1}"),
    (r"(encoder|decoder)/layer_(\d+)/ffn/layer_norm/gamma", "model.{0}.layers.{1}.final_layer_norm.weight"),
    (r"(encoder|decoder)/layer_(\d+)/ffn/layer_norm/beta", "model.{0}.layers.{1}.final_layer_norm.bias"),
    (r"(encoder|decoder)/layer_(\d+)/ffn/linear_0/(weight|bias)", "model.{0}.layers.{1}.fc1.{2}"),
    (r"(encoder|decoder)/layer_(\d+)/ffn/linear_1/(weight|bias)", "model.{0}.layers.{1}.fc2.{2}"),
]
_COMPILED = [(re.compile(pattern + "$"), target) for pattern, target in _RENAMES]
# The K projection has no bias in Whisper; CTranslate2 stores zeros for it inside the fused bias.
_ABSENT_BIAS = re.compile(r"\.k_proj\.bias$")


def _split(name: str, array: np.ndarray, targets: tuple[str, ...]) -> dict[str, np.ndarray]:
    parts = np.split(array, len(targets), axis=0)
    out = {}
    for target, part in zip(targets, parts, strict=True):
        if _ABSENT_BIAS.search(target):
            if np.any(part != 0):
                raise CheckpointError(f"{name}: non-zero key bias, which Whisper does not have")
            continue
        out[target] = part
    return out


def rename_variables(variables: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], list[str]]:
    """CTranslate2 variable names -> HF keys; returns (tensors, names that map to nothing)."""
    renamed: dict[str, np.ndarray] = {}
    dropped: list[str] = []
    for name, array in variables.items():
        for pattern, target in _COMPILED:
            match = pattern.match(name)
            if match:
                if isinstance(target, tuple):
                    renamed.update(_split(name, array, tuple(t.format(*match.groups()) for t in target)))
                else:
                    renamed[target.format(*match.groups())] = array
                break
        else:
            dropped.append(name)
    return renamed, dropped


def _config_from(variables: dict[str, np.ndarray], meta: dict) -> dict:
    def count_layers(side: str) -> int:
        return len({m.group(1) for k in variables if (m := re.match(side + r"/layer_(\d+)/", k))})

    embeddings = variables["decoder/embeddings/weight"]
    return {
        "vocab_size": int(embeddings.shape[0]),
        "d_model": int(embeddings.shape[1]),
        "num_mel_bins": int(variables["encoder/conv1/weight"].shape[1]),
        "encoder_layers": count_layers("encoder"),
        "decoder_layers": count_layers("decoder"),
        "encoder_attention_heads": int(variables["encoder/num_heads"]),
        "decoder_attention_heads": int(variables["decoder/num_heads"]),
        "encoder_ffn_dim": int(variables["encoder/layer_0/ffn/linear_0/weight"].shape[0]),
        "decoder_ffn_dim": int(variables["decoder/layer_0/ffn/linear_0/weight"].shape[0]),
        "max_source_positions": int(variables["encoder/position_encodings/encodings"].shape[0]),
        "max_target_positions": int(variables["decoder/position_encodings/encodings"].shape[0]),
        "suppress_tokens": meta.get("suppress_ids", []),
        "begin_suppress_tokens": meta.get("suppress_ids_begin", []),
        "alignment_heads": meta.get("alignment_heads", []),
    }


def _weight_files(source: ModelSource) -> list[Path]:
    if source.weight_files:
        return list(source.weight_files)
    whole = source.directory / "model.bin"
    if whole.is_file():
        return [whole]
    parts = sorted(source.directory.glob("model.bin.part*"), key=lambda p: int(re.sub(r"\D", "", p.suffix) or 0))
    if not parts:
        raise CheckpointError(f"{source}: no model.bin (or model.bin.part*) in {source.directory}")
    return parts


@CONVERTERS.register("ctranslate2")
class CTranslate2Converter:
    @staticmethod
    def detect(source: ModelSource) -> bool:
        d = source.directory
        has_weights = bool(source.weight_files) or (d / "model.bin").is_file() or any(d.glob("model.bin.part*"))
        return has_weights and (d / "config.json").is_file() and not (d / "oasr.json").is_file()

    @staticmethod
    def load(source: ModelSource) -> Checkpoint:
        meta = json.loads(require_file(source.directory / "config.json").read_text())
        ct2 = read_ct2_model(_weight_files(source))
        if ct2.spec != "WhisperSpec":
            raise CheckpointError(f"{source}: CTranslate2 spec {ct2.spec!r} is not supported (only WhisperSpec)")
        if any(name.endswith("weight_scale") for name in ct2.variables):
            raise CheckpointError(f"{source}: quantized CTranslate2 weights (int8/int16) are not supported yet")
        renamed, dropped = rename_variables(ct2.variables)
        state_dict = {k: torch.from_numpy(np.array(v, dtype=np.float32)) for k, v in renamed.items()}
        return Checkpoint(
            architecture="whisper",
            config=_config_from(ct2.variables, meta),
            state_dict=state_dict,
            tokenizer_file=require_file(source.directory / "tokenizer.json"),
            format="ctranslate2",
            dropped_keys=dropped,
        )
