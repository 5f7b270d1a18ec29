"""Whisper's encoder layers see row-contiguous hidden states: the convolution front is channel-major, and a
transposed view carried into the layers makes every residual add a strided copy and every LayerNorm copy its
input (measured on the H200 at large-v3's shape: a quarter of the encoder's time)."""

from __future__ import annotations

import torch

from oasr.models import ARCHITECTURES


def test_every_encoder_layer_and_norm_gets_contiguous_rows() -> None:
    arch = ARCHITECTURES.get("whisper")
    config = arch.tiny_config()
    model = arch.from_config(config).eval()
    encoder = model.model.encoder
    seen: list[tuple[str, bool]] = []
    modules = [(f"layer {i}", layer) for i, layer in enumerate(encoder.layers)] + [("final norm", encoder.layer_norm)]
    for name, module in modules:
        module.register_forward_pre_hook(lambda _m, args, name=name: seen.append((name, args[0].is_contiguous())))
    features, _ = arch.example_inputs(config)
    with torch.inference_mode():
        encoder(features)
    assert len(seen) == len(modules)
    assert all(contiguous for _, contiguous in seen), seen
