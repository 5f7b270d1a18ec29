"""openai-whisper (``import whisper``) holding the weights OASR loaded: the reference for timestamp decoding,
long-form transcription and language detection.

OASR keeps Whisper in the Hugging Face key layout; openai-whisper names the same tensors differently. The
whole rename lives in the tables below.
"""

from __future__ import annotations

import re

import torch

# OASR (Hugging Face layout) -> openai-whisper, inside one encoder or decoder layer.
_LAYER_PARTS = {
    "self_attn.q_proj": "attn.query",
    "self_attn.k_proj": "attn.key",
    "self_attn.v_proj": "attn.value",
    "self_attn.out_proj": "attn.out",
    "self_attn_layer_norm": "attn_ln",
    "encoder_attn.q_proj": "cross_attn.query",
    "encoder_attn.k_proj": "cross_attn.key",
    "encoder_attn.v_proj": "cross_attn.value",
    "encoder_attn.out_proj": "cross_attn.out",
    "encoder_attn_layer_norm": "cross_attn_ln",
    "fc1": "mlp.0",
    "fc2": "mlp.2",
    "final_layer_norm": "mlp_ln",
}
# Whole keys outside the layers.
_TOP_LEVEL = {
    "model.encoder.conv1.weight": "encoder.conv1.weight",
    "model.encoder.conv1.bias": "encoder.conv1.bias",
    "model.encoder.conv2.weight": "encoder.conv2.weight",
    "model.encoder.conv2.bias": "encoder.conv2.bias",
    "model.encoder.embed_positions.weight": "encoder.positional_embedding",
    "model.encoder.layer_norm.weight": "encoder.ln_post.weight",
    "model.encoder.layer_norm.bias": "encoder.ln_post.bias",
    "model.decoder.embed_tokens.weight": "decoder.token_embedding.weight",
    "model.decoder.embed_positions.weight": "decoder.positional_embedding",
    "model.decoder.layer_norm.weight": "decoder.ln.weight",
    "model.decoder.layer_norm.bias": "decoder.ln.bias",
}
_LAYER_KEY = re.compile(r"^model\.(encoder|decoder)\.layers\.(\d+)\.(.+)\.(weight|bias)$")
_SKIPPED = {"proj_out.weight"}  # tied to the token embedding in both layouts


def openai_key(key: str) -> str:
    if key in _TOP_LEVEL:
        return _TOP_LEVEL[key]
    match = _LAYER_KEY.match(key)
    if match is None or match.group(3) not in _LAYER_PARTS:
        raise KeyError(f"no openai-whisper name for {key!r}")
    side, index, part, kind = match.groups()
    return f"{side}.blocks.{index}.{_LAYER_PARTS[part]}.{kind}"


def openai_whisper_from(loaded):
    """``whisper.model.Whisper`` with the weights of ``loaded`` (loaded with ``keep_checkpoint=True``), fp32, CPU."""
    from whisper.model import ModelDimensions, Whisper

    c = loaded.config
    dims = ModelDimensions(
        n_mels=c.num_mel_bins,
        n_audio_ctx=c.max_source_positions,
        n_audio_state=c.d_model,
        n_audio_head=c.encoder_attention_heads,
        n_audio_layer=c.encoder_layers,
        n_vocab=c.vocab_size,
        n_text_ctx=c.max_target_positions,
        n_text_state=c.d_model,
        n_text_head=c.decoder_attention_heads,
        n_text_layer=c.decoder_layers,
    )
    model = Whisper(dims)
    state = {openai_key(k): v.float() for k, v in loaded.checkpoint.state_dict.items() if k not in _SKIPPED}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"weights do not fit openai-whisper: missing {missing}, unexpected {unexpected}")
    return model.eval().to(torch.float32)
