"""Every rename from NeMo's state-dict keys to OASR's (the transformers key layout), per architecture.

Rules are (pattern, replacement) pairs applied in order to each key; a key no rule changes is kept as is (most of
the FastConformer block already has NeMo's names: ``feed_forward1.linear1``, ``norm_self_att``, ``conv.depthwise_conv``).
Keys of modules OASR computes itself or does not run are dropped: the featurizer's mel filters and window, a
hybrid model's auxiliary CTC head, and the ``num_batches_tracked`` counters of layer-normed convolution modules.
"""

from __future__ import annotations

import re

import torch

Renames = tuple[tuple[str, str], ...]

_ATTENTION: Renames = (
    (r"\.self_attn\.linear_q\.", ".self_attn.q_proj."),
    (r"\.self_attn\.linear_k\.", ".self_attn.k_proj."),
    (r"\.self_attn\.linear_v\.", ".self_attn.v_proj."),
    (r"\.self_attn\.linear_out\.", ".self_attn.o_proj."),
    (r"\.self_attn\.linear_pos\.", ".self_attn.relative_k_proj."),
    (r"\.self_attn\.pos_bias_u$", ".self_attn.bias_u"),
    (r"\.self_attn\.pos_bias_v$", ".self_attn.bias_v"),
    (r"\.conv\.batch_norm\.", ".conv.norm."),  # a batch norm, or a layer norm under NeMo's old name
)
# Parakeet's subsampling keeps NeMo's sequential indices (conv, ReLU, then depthwise, pointwise, ReLU per stage).
_SUBSAMPLING: Renames = (
    (r"^((?:model\.)?encoder)\.pre_encode\.conv\.", r"\1.subsampling.layers."),
    (r"^((?:model\.)?encoder)\.pre_encode\.out\.", r"\1.subsampling.linear."),
)
# The causal subsampling names its stages: NeMo's index 0 is the first conv, then (3k + 2, 3k + 3) stage k's
# depthwise and pointwise convs (indices 1, 4, 7 are the ReLUs).
_CAUSAL_SUBSAMPLING: Renames = (
    (r"^encoder\.pre_encode\.conv\.0\.", "encoder.subsampling.conv_in."),
    (r"^encoder\.pre_encode\.conv\.2\.", "encoder.subsampling.layers.0.depthwise_conv."),
    (r"^encoder\.pre_encode\.conv\.3\.", "encoder.subsampling.layers.0.pointwise_conv."),
    (r"^encoder\.pre_encode\.conv\.5\.", "encoder.subsampling.layers.1.depthwise_conv."),
    (r"^encoder\.pre_encode\.conv\.6\.", "encoder.subsampling.layers.1.pointwise_conv."),
    (r"^encoder\.pre_encode\.conv\.8\.", "encoder.subsampling.layers.2.depthwise_conv."),
    (r"^encoder\.pre_encode\.conv\.9\.", "encoder.subsampling.layers.2.pointwise_conv."),
    (r"^encoder\.pre_encode\.out\.", "encoder.subsampling.linear."),
)
_CTC_HEAD: Renames = ((r"^decoder\.decoder_layers\.0\.", "ctc_head."),)
# NeMo's joint projects both sides to the joint width (joint.enc, joint.pred) and ends in joint_net = [activation,
# dropout, Linear]; transformers keeps the encoder's projection at the top and the predictor's in the decoder.
_TRANSDUCER: Renames = (
    (r"^decoder\.prediction\.embed\.", "decoder.embedding."),
    (r"^decoder\.prediction\.dec_rnn\.lstm\.", "decoder.lstm."),
    (r"^joint\.enc\.", "encoder_projector."),
    (r"^joint\.pred\.", "decoder.decoder_projector."),
    (r"^joint\.joint_net\.\d+\.", "joint.head."),  # after the activation (and a dropout if trained with one)
)
# Canary: the encoder under ``model.``, NeMo's transformer decoder in transformers' names (as Cohere Transcribe's
# published checkpoint, oasr.models.converters.huggingface), the vocabulary head as ``proj_out``.
_CANARY: Renames = (
    (r"^encoder\.", "model.encoder."),
    (r"^transf_decoder\._embedding\.token_embedding\.", "model.decoder.embed_tokens."),
    (r"^transf_decoder\._embedding\.layer_norm\.", "model.decoder.embedding_layernorm."),
    # NeMo's fixed sinusoidal table (sines and cosines interleaved, already scaled by 1 / sqrt(d)) is a buffer the
    # archive holds; OASR's own table puts sines and cosines in halves, as transformers' Canary does, so the
    # archive's table is loaded as the decoder's position embedding instead (nemo_canary: positions "learned").
    (r"^transf_decoder\._embedding\.position_embedding\.pos_enc$", "model.decoder.pos_emb.weight"),
    (r"^transf_decoder\._decoder\.final_layer_norm\.", "model.decoder.norm."),
    (r"^transf_decoder\._decoder\.layers\.", "model.decoder.layers."),
    (r"\.first_sub_layer\.query_net\.", ".self_attn.q_proj."),
    (r"\.first_sub_layer\.key_net\.", ".self_attn.k_proj."),
    (r"\.first_sub_layer\.value_net\.", ".self_attn.v_proj."),
    (r"\.first_sub_layer\.out_projection\.", ".self_attn.out_proj."),
    (r"\.second_sub_layer\.query_net\.", ".encoder_attn.q_proj."),
    (r"\.second_sub_layer\.key_net\.", ".encoder_attn.k_proj."),
    (r"\.second_sub_layer\.value_net\.", ".encoder_attn.v_proj."),
    (r"\.second_sub_layer\.out_projection\.", ".encoder_attn.out_proj."),
    (r"\.third_sub_layer\.dense_in\.", ".mlp.fc1."),
    (r"\.third_sub_layer\.dense_out\.", ".mlp.fc2."),
    (r"\.layer_norm_1\.", ".input_layernorm."),
    (r"\.layer_norm_2\.", ".post_attention_layernorm."),
    (r"\.layer_norm_3\.", ".final_layernorm."),
    (r"^log_softmax\.mlp\.layer0\.", "proj_out."),
)
RENAMES: dict[str, Renames] = {
    "parakeet_ctc": _SUBSAMPLING + _ATTENTION + _CTC_HEAD,
    "parakeet_rnnt": _SUBSAMPLING + _ATTENTION + _TRANSDUCER,
    "parakeet_tdt": _SUBSAMPLING + _ATTENTION + _TRANSDUCER,
    "nemotron_asr_streaming": _CAUSAL_SUBSAMPLING + _ATTENTION + _TRANSDUCER,
    "canary": _CANARY + _SUBSAMPLING + _ATTENTION,  # _CANARY first: it moves the encoder under model.
}
# Dropped in every architecture: NeMo's featurizer buffers (the frontend computes its own filters and window).
_ALWAYS_DROPPED = ("preprocessor.",)
# Token-type embeddings (``num_token_types`` > 0) are built but never added while decoding: NeMo passes no token types.
_DROPPED_PATTERNS = (re.compile(r"^transf_decoder\._embedding\.token_type_embedding\."),)


def rename_state(architecture: str, state: dict[str, torch.Tensor], dropped_prefixes: tuple[str, ...] = ()
                 ) -> tuple[dict[str, torch.Tensor], list[str]]:
    """NeMo's state dict in ``architecture``'s key layout, and the NeMo keys dropped."""
    rules = [(re.compile(pattern), replacement) for pattern, replacement in RENAMES[architecture]]
    prefixes = _ALWAYS_DROPPED + dropped_prefixes
    renamed: dict[str, torch.Tensor] = {}
    dropped: list[str] = []
    for key, tensor in state.items():
        if key.startswith(prefixes) or any(p.match(key) for p in _DROPPED_PATTERNS):
            dropped.append(key)
            continue
        new_key = key
        for pattern, replacement in rules:
            new_key = pattern.sub(replacement, new_key)
        renamed[new_key] = tensor
    return renamed, dropped
