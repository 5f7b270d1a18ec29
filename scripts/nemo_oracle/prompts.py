"""The decoder prompt NeMo builds for a multitask (Canary) model, shared by the archive builder and the fitting
loop (each imports it from here, so neither imports the other)."""

from __future__ import annotations

import torch


def prompt_ids(model: torch.nn.Module, prompt: dict) -> list[int]:
    """The decoder prompt NeMo's ``transcribe`` builds for these options (its default slots, then the options)."""
    from nemo.collections.asr.models.aed_multitask_models import parse_multitask_prompt

    turns = model.prompt.get_default_dialog_slots()
    for key, value in parse_multitask_prompt(dict(prompt))[0]["slots"].items():
        turns[0]["slots"][key] = value
    return [int(t) for t in model.prompt.encode_dialog(turns=turns)["context_ids"]]
