"""A few hundred teacher-forced steps for the tiny Canary: random attention decoders with a tied vocabulary head
settle on repeating one token whatever the audio (the residual stream carries the input token's own embedding),
so the tiny model is fitted to say a different sentence per clip and per target language. Its greedy output then
varies across clips, tokens and prompts and ends with <|endoftext|>, which is what the golden needs to be a test.
The RNN-T archive gets the same treatment (``fit_transducer``), for the same reason."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from configs import TEXT
from prompts import prompt_ids

STEPS = 150
LEARNING_RATE = 3e-3
TRANSDUCER_STEPS = 60


def _examples(model: torch.nn.Module, audio: list[np.ndarray], prompts: tuple[dict[str, Any], ...]) -> list:
    """(signal [1, T], length [1], prompt + text + <|endoftext|> ids [1, L], prompt length) per clip and prompt."""
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


def fit_transducer(model: torch.nn.Module, audio: list[np.ndarray]) -> None:
    """The same for a transducer (RNN-T loss through NeMo's own joint and loss modules): a random prediction network
    and joint emit one token over and over, whatever the audio."""
    examples = []
    for c, clip in enumerate(audio):
        signal = torch.from_numpy(clip).unsqueeze(0)
        examples.append((signal, torch.tensor([signal.shape[1]]), torch.tensor([model.tokenizer.text_to_ids(TEXT[c])])))
    optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
    model.train()
    for step in range(TRANSDUCER_STEPS):
        optimizer.zero_grad()
        total = 0.0
        for signal, length, targets in examples:
            encoded, encoded_len = model.forward(input_signal=signal, input_signal_length=length)
            target_len = torch.tensor([targets.shape[1]])
            decoder, _, _ = model.decoder(targets=targets, target_length=target_len)
            joint = model.joint(encoder_outputs=encoded, decoder_outputs=decoder)
            loss = model.loss(log_probs=joint, targets=targets, input_lengths=encoded_len, target_lengths=target_len)
            loss = loss.mean()
            loss.backward()
            total += loss.item()
        optimizer.step()
        if step % 25 == 0 or step == TRANSDUCER_STEPS - 1:
            print(f"fit step {step}: loss {total / len(examples):.3f}", flush=True)
    model.eval()
