"""Canary's ``model_config.yaml`` (``EncDecMultiTaskModel``) -> OASR's ``canary`` architecture.

What NeMo 3.0 builds for Canary-1B-v2 is served: prompt format ``canary2``, one SentencePiece model holding the
prompt tokens (``tokenizer.type: bpe``, read by ``CanaryBPETokenizer``), no transformer encoder between the
FastConformer and the decoder, encoder and decoder of one width (no ``encoder_decoder_proj``), and NeMo's pre-LN
transformer decoder with fixed sinusoidal positions (the archive's own table, loaded as a position embedding) whose vocabulary head (``TokenClassifier``) shares the token
embedding. Canary-1B and the flash models (prompt format ``canary``, or an aggregate tokenizer of one SentencePiece
model per language, ``tokenizer.type: agg``) are refused naming the field.

The token ids and the prompt's leading pieces depend on the tokenizer, not the config: ``canary_tokens`` reads
them from the SentencePiece model once the converter has it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sentencepiece

from oasr.errors import CheckpointError
from oasr.models.converters.nemo_yaml import NemoYaml

_DECODER_TARGET = "get_nemo_transformer"  # nemo.collections.asr.modules.transformer.get_nemo_transformer
_HEAD_TARGET = "TokenClassifier"
# The pieces the config's token ids name, as NeMo's CanaryBPETokenizer finds them (by name, never by number).
_PAD, _EOS, _BOS, _CONTEXT = "<pad>", "<|endoftext|>", "<|startoftranscript|>", "<|startofcontext|>"


def canary(cfg: NemoYaml, encoder: dict[str, Any], frontend: dict[str, Any], vocab_size: int) -> dict[str, Any]:
    """The ``canary`` config dict (transformers' ``CanaryConfig`` layout) of a multitask model whose prompt
    format and tokenizer type ``map_config`` has checked; token ids are filled in by ``canary_tokens``."""
    if int(cfg.get("transf_encoder.num_layers", 0)):
        raise cfg.refuse("transf_encoder.num_layers", cfg.get("transf_encoder.num_layers"),
                         "0 (no transformer encoder between the FastConformer and the decoder)")
    decoder = "transf_decoder.config_dict"
    if not str(cfg.get("transf_decoder._target_", "")).endswith(_DECODER_TARGET):
        raise cfg.refuse("transf_decoder._target_", cfg.get("transf_decoder._target_"), f"'...{_DECODER_TARGET}'")
    cfg.expect(f"{decoder}.pre_ln", (True,), False)
    cfg.expect("transf_decoder.pre_ln_final_layer_norm", (True,), True)
    cfg.expect(f"{decoder}.learn_positional_encodings", (False,), False)
    if not str(cfg.get("head._target_", "")).endswith(_HEAD_TARGET):
        raise cfg.refuse("head._target_", cfg.get("head._target_"), f"'...{_HEAD_TARGET}' (tied to the embedding)")
    cfg.expect("head.num_layers", (1,), 1)
    hidden = int(cfg.require(f"{decoder}.hidden_size"))
    if hidden != encoder["hidden_size"]:
        raise cfg.refuse(f"{decoder}.hidden_size", hidden,
                         f"the encoder's width ({encoder['hidden_size']}); a projection between them is not mapped")
    heads = int(cfg.require(f"{decoder}.num_attention_heads"))
    if hidden % heads:
        raise cfg.refuse(f"{decoder}.num_attention_heads", heads, f"a divisor of hidden_size {hidden}")
    decoder_config = {
        "vocab_size": vocab_size,
        "hidden_size": hidden,
        "intermediate_size": int(cfg.require(f"{decoder}.inner_size")),
        "num_hidden_layers": int(cfg.require(f"{decoder}.num_layers")),
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "head_dim": hidden // heads,
        "hidden_act": cfg.expect(f"{decoder}.hidden_act", ("relu", "gelu"), "relu"),
        "max_position_embeddings": int(cfg.get(f"{decoder}.max_sequence_length", 512)),
        # NeMo's sinusoidal table interleaves sines and cosines; the archive's copy is loaded (nemo_keys).
        "positions": "learned",
    }
    # NeMo's featurizer dithers only while training; inference sees the audio as it is.
    preprocessor = {k: v for k, v in frontend.items() if k != "normalize"} | {"dither": 0.0}
    return {"encoder_config": encoder, "decoder_config": decoder_config, "vocab_size": vocab_size,
            "tie_word_embeddings": True, "preprocessor": preprocessor, "default_language": _default_language(cfg)}


def _default_language(cfg: NemoYaml) -> str | None:
    """The source language the archive's ``prompt_defaults`` give a prompt that names none (``<|en|>`` -> en)."""
    for turn in cfg.get("prompt_defaults") or []:
        if isinstance(turn, dict) and turn.get("role") == "user":
            language = (turn.get("slots") or {}).get("source_lang")
            if isinstance(language, str) and language:
                return language.removeprefix("<|").removesuffix("|>")
    return None


@dataclass(frozen=True)
class CanaryTokens:
    """What the SentencePiece model decides: the special ids and the pieces SentencePiece puts before the first
    prompt token when NeMo encodes the whole prompt as one string (its dummy-prefix ``▁``, when the model adds one)."""

    pad_token_id: int
    eos_token_id: int
    bos_token_id: int
    decoder_start_token_id: int
    prompt_prefix: tuple[str, ...]


def canary_tokens(tokenizer_model: bytes, source: str) -> CanaryTokens:
    processor = sentencepiece.SentencePieceProcessor()
    try:
        processor.LoadFromSerializedProto(tokenizer_model)
    except (RuntimeError, OSError) as exc:
        raise CheckpointError(f"{source}: the archive's tokenizer is not a SentencePiece model: {exc}") from None
    ids = {}
    for piece in (_PAD, _EOS, _BOS, _CONTEXT):
        token_id = processor.PieceToId(piece)
        if processor.IdToPiece(token_id) != piece:  # PieceToId answers <unk>'s id for an unknown piece
            raise CheckpointError(f"{source}: the tokenizer has no {piece} (a canary2 prompt needs it)")
        ids[piece] = token_id
    # NeMo's Canary2PromptFormatter encodes "<|startofcontext|><|startoftranscript|>..." in one call.
    pieces = processor.EncodeAsPieces(_CONTEXT + _BOS)
    prefix = tuple(pieces[: pieces.index(_CONTEXT)]) if _CONTEXT in pieces else ()
    return CanaryTokens(ids[_PAD], ids[_EOS], ids[_BOS], ids[_CONTEXT], prefix)
