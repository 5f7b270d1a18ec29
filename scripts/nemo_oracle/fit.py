"""A few hundred teacher-forced steps for the tiny Canary: random attention decoders with a tied vocabulary head
settle on repeating one token whatever the audio (the residual stream carries the input token's own embedding),
so the tiny model is fitted to say a different sentence per clip and per target language. Its greedy output then
varies across clips, tokens and prompts and ends with <|endoftext|>, which is what the golden needs to be a test."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from configs import TEXT

STEPS = 150
LEARNING_RATE = 3e-3


def _examples(model: torch.nn.Module, audio: list[np.ndarray], prompts: tuple[dict[str, Any], ...]) -> list:
    """(signal [1, T], length [1], prompt + text + <|endoftext|> ids [1, L], prompt length) per clip and prompt."""
    from build_archives import prompt_ids

    examples = []
    for p, prompt in enumerate(prompts):
        context = prompt_ids(model, prompt)
        for c, clip in enumerate(audio):
            text = TEXT[(c + p) % len(TEXT)] if p == 0 else " ".join(reversed(TEXT[(c + p) % len(TEXT)].split()))
            ids = context + model.tokenizer.text_to_ids(text) + [model.tokenizer.eos_id]
            signal = torch.from_numpy(clip).unsqueeze(0)
            examples.append((signal, torch.tensor([signal.shape[1]]), torch.tensor([ids]), len(context)))
    return examples


def fit_canary(model: torch.nn.Module, audio: list[np.ndarray], prompts: tuple[dict[str, Any], ...]) -> None:
    examples = _examples(model, audio, prompts)
    optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
    generator = torch.Generator().manual_seed(0)
    model.train()
    for step in range(STEPS):
        optimizer.zero_grad()
        total = 0.0
        for index in torch.randperm(len(examples), generator=generator).tolist():
            signal, length, ids, context = examples[index]
            log_probs, _, _, _ = model.forward(input_signal=signal, input_signal_length=length,
                                               transcript=ids[:, :-1], transcript_length=torch.tensor([ids.shape[1] - 1]))
            # only the answer is scored: the prompt is given
            loss = torch.nn.functional.nll_loss(log_probs[0, context - 1:], ids[0, context:])
            loss.backward()
            total += float(loss)
        optimizer.step()
        if step % 50 == 0 or step == STEPS - 1:
            print(f"fit step {step}: loss {total / len(examples):.3f}", flush=True)
    model.eval()
