"""Whisper shapes with random weights, so speed at large sizes can be compared without those checkpoints."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from oasr.features import FEATURE_EXTRACTORS
from oasr.layers import apply_backend
from oasr.models import ARCHITECTURES
from oasr.models.embedded import resolve_embedded
from oasr.models.loader import LoadedModel
from oasr.tokenizers import TOKENIZERS

# Through the registry, as everything outside oasr/models/ reaches a family (tests/test_seams.py).
WhisperConfig = ARCHITECTURES.get("whisper").config_class
WHISPER_SHAPES: dict[str, Any] = {
    "whisper-small": WhisperConfig(vocab_size=51865, num_mel_bins=80, d_model=768, encoder_layers=12,
                                   encoder_attention_heads=12, encoder_ffn_dim=3072, decoder_layers=12,
                                   decoder_attention_heads=12, decoder_ffn_dim=3072),
    "whisper-tiny": WhisperConfig(vocab_size=51865, num_mel_bins=80, d_model=384, encoder_layers=4,
                                  encoder_attention_heads=6, encoder_ffn_dim=1536, decoder_layers=4,
                                  decoder_attention_heads=6, decoder_ffn_dim=1536),
    "whisper-large-v3": WhisperConfig(vocab_size=51866, num_mel_bins=128, d_model=1280, encoder_layers=32,
                                      encoder_attention_heads=20, encoder_ffn_dim=5120, decoder_layers=32,
                                      decoder_attention_heads=20, decoder_ffn_dim=5120),
}
WHISPER_SHAPES["whisper-large-v3-turbo"] = replace(WHISPER_SHAPES["whisper-large-v3"], decoder_layers=4)


def random_whisper(
    arch: str, *, device: torch.device, dtype: torch.dtype, seed: int = 0, tokenizer_file: Path | None = None
) -> tuple[LoadedModel, dict]:
    """A randomly initialised Whisper of a published shape. Special tokens come from a multilingual
    ``tokenizer.json`` (default: the ``base`` package's). Returns the model and its state dict (for a peer)."""
    if arch not in WHISPER_SHAPES:
        raise ValueError(f"unknown shape {arch!r}; choose one of {', '.join(WHISPER_SHAPES)}")
    config = WHISPER_SHAPES[arch]
    torch.manual_seed(seed)
    cls = ARCHITECTURES.get("whisper")
    model = cls.from_config(config)
    with torch.no_grad():  # small weights keep fp16 activations finite through 32 layers
        for p in model.parameters():
            p.mul_(0.5)
    state = {k: v.clone() for k, v in model.state_dict().items() if k != "proj_out.weight"}
    model = model.to(device=device, dtype=dtype).eval().requires_grad_(False)
    tokenizer_file = tokenizer_file or resolve_embedded("base").directory / "tokenizer.json"
    loaded = LoadedModel(
        name=f"{arch} (random weights)",
        architecture="whisper",
        format="random",
        config=config,
        model=model,
        tokenizer=TOKENIZERS.get("whisper_hf_json")(tokenizer_file),
        features=FEATURE_EXTRACTORS.get("whisper_logmel").for_model(config),
        device=device,
        dtype=dtype,
        # The backend from_pretrained would pick, so a random model runs what a loaded one runs.
        kernel_gaps=apply_backend(model, "kernels" if device.type == "cuda" else "torch"),
    )
    return loaded, state
