"""transformers' Whisper on the same weights OASR loaded: the reference for token parity tests."""

from __future__ import annotations

import torch
from transformers import GenerationConfig, WhisperConfig, WhisperForConditionalGeneration

from oasr.models.loader import LoadedModel


def hf_whisper_from(loaded: LoadedModel, state_dict: dict[str, torch.Tensor]) -> WhisperForConditionalGeneration:
    c = loaded.config
    special = loaded.tokenizer.special
    hf_config = WhisperConfig(
        vocab_size=c.vocab_size,
        num_mel_bins=c.num_mel_bins,
        d_model=c.d_model,
        encoder_layers=c.encoder_layers,
        encoder_attention_heads=c.encoder_attention_heads,
        encoder_ffn_dim=c.encoder_ffn_dim,
        decoder_layers=c.decoder_layers,
        decoder_attention_heads=c.decoder_attention_heads,
        decoder_ffn_dim=c.decoder_ffn_dim,
        max_source_positions=c.max_source_positions,
        max_target_positions=c.max_target_positions,
        decoder_start_token_id=special.sot,
        eos_token_id=special.eot,
        pad_token_id=special.eot,
        bos_token_id=special.eot,
    )
    model = WhisperForConditionalGeneration(hf_config)
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    assert not unexpected and set(missing) <= {"proj_out.weight"}, (missing, unexpected)
    model.tie_weights()
    languages = list(special.language_ids.items())[: c.num_languages]
    model.generation_config = GenerationConfig(
        decoder_start_token_id=special.sot,
        eos_token_id=special.eot,
        pad_token_id=special.eot,
        max_length=c.max_target_positions,
        suppress_tokens=list(c.suppress_tokens),
        begin_suppress_tokens=list(c.begin_suppress_tokens),
        no_timestamps_token_id=special.no_timestamps,
        is_multilingual=c.is_multilingual,
        alignment_heads=[list(p) for p in c.alignment_heads],
    )
    if c.is_multilingual:  # English-only checkpoints carry no language or task tokens in their prompt
        model.generation_config.lang_to_id = {f"<|{name}|>": lid for name, lid in languages}
        model.generation_config.task_to_id = {"transcribe": special.transcribe, "translate": special.translate}
    return model.eval()
