"""transformers' Whisper on the same weights OASR loaded: the reference for parity tests and the speed peer."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from oasr.models.loader import LoadedModel


def hf_whisper_config(c, **extra):
    """transformers' WhisperConfig with the shapes of OASR's ``WhisperConfig`` ``c`` (plus ``extra`` fields)."""
    from transformers import WhisperConfig

    return WhisperConfig(
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
        **extra,
    )


def hf_whisper_from(loaded: LoadedModel, state_dict: dict[str, torch.Tensor], *, attn_implementation: str = "sdpa"):
    """A ``transformers`` WhisperForConditionalGeneration holding ``state_dict`` (OASR's HF-layout keys), with a
    generation config equivalent to the checkpoint's (suppress lists, language and task tokens)."""
    from transformers import GenerationConfig, WhisperForConditionalGeneration

    c = loaded.config
    special = loaded.tokenizer.special
    hf_config = hf_whisper_config(
        c,
        decoder_start_token_id=special.sot,
        eos_token_id=special.eot,
        pad_token_id=special.eot,
        bos_token_id=special.eot,
        attn_implementation=attn_implementation,
    )
    model = WhisperForConditionalGeneration(hf_config)
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    if unexpected or not set(missing) <= {"proj_out.weight"}:
        raise ValueError(f"state dict does not fit transformers' Whisper: missing {missing}, unexpected {unexpected}")
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


@dataclass(frozen=True)
class PeerRun:
    batch_size: int
    seconds: float
    token_ids: list[list[int]]


def run_transformers(
    model,
    loaded: LoadedModel,
    audio: Sequence[np.ndarray],
    *,
    batch_size: int,
    device: torch.device,
    dtype: torch.dtype,
    language: str | None = None,
    fixed_output_tokens: int | None = None,
) -> PeerRun:
    """Timed batched ``generate`` as a transformers user would run it: features computed on the GPU
    (WhisperFeatureExtractor's torch path), fp16/bf16, SDPA attention, greedy."""
    from transformers import GenerationMixin, WhisperFeatureExtractor

    extractor = WhisperFeatureExtractor(feature_size=loaded.config.num_mel_bins)
    eot = loaded.tokenizer.special.eot
    tokens: list[list[int]] = []
    torch.cuda.synchronize(device) if device.type == "cuda" else None
    start = time.perf_counter()
    with torch.inference_mode():
        for i in range(0, len(audio), batch_size):
            chunk = [np.asarray(a) for a in audio[i : i + batch_size]]
            features = extractor(chunk, sampling_rate=16000, return_tensors="pt", device=str(device)).input_features
            features = features.to(device=device, dtype=dtype)
            if fixed_output_tokens:
                prompt = torch.tensor([loaded_prompt(loaded)] * len(chunk), device=device)
                # The generic loop: Whisper's own generate() re-derives the prompt and would not fix the length.
                out = GenerationMixin.generate(
                    model,
                    input_features=features, decoder_input_ids=prompt, do_sample=False, num_beams=1,
                    min_new_tokens=fixed_output_tokens, max_new_tokens=fixed_output_tokens,
                )
                tokens.extend(out[:, prompt.shape[1] :].tolist())  # random weights emit any id: keep them all
                continue
            else:
                kwargs = {"language": language, "task": "transcribe"} if loaded.config.is_multilingual else {}
                out = model.generate(features, do_sample=False, num_beams=1, return_timestamps=False, **kwargs)
            tokens.extend([t for t in row if t < eot] for row in out.tolist())
    torch.cuda.synchronize(device) if device.type == "cuda" else None
    return PeerRun(batch_size, time.perf_counter() - start, tokens)


def loaded_prompt(loaded: LoadedModel) -> list[int]:
    from oasr.types import DecodeOptions

    prompter = type(loaded.model).prompt_builder(loaded.config, loaded.tokenizer, loaded.name)
    return list(prompter.prompt(DecodeOptions(), "en").token_ids)
