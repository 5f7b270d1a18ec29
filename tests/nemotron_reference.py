"""Tiny random transformers Nemotron models (``NemotronAsrStreamingForRNNT``, ``Nemotron3_5AsrForRNNT``) built
from OASR's tiny configs, their feature extractor, and their own offline greedy decoding, for the parity tests.

The weights are randomized and the joint's encoder side calibrated as Parakeet's (``parakeet_reference.randomize``),
on the features the tests decode. On real audio that alone leaves a random predictor too weak to matter: every
frame emits its token max_symbols_per_step times. ``counter_repeats`` sets the predictor's output projection so
that having just emitted a token pushes the joint away from that token, and the reference then emits a varied mix
of tokens and blanks (runs of at most a few). Nemotron 3.5's prompt projector is randomized the same way, which
leaves the one-hot prompt a small share of its input; ``prompt_gain`` scales the prompt's columns of
``linear_1`` so that the language changes the tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import transformers

import oasr
from oasr.audio import load_audio
from oasr.models import ARCHITECTURES
from parakeet_reference import attention_mask, calibrate_heads, randomize_weights, reference_tokenizer, write_tokenizer

JFK = Path(oasr.__file__).parent / "assets" / "jfk.flac"
SEED, BLANK_BIAS, REPEAT_PENALTY = 1, 5.0, 6.0
# OASR architecture -> the transformers (config, model) classes of the same checkpoint layout.
_CLASSES = {
    "nemotron_asr_streaming": (transformers.NemotronAsrStreamingConfig, transformers.NemotronAsrStreamingForRNNT),
    "nemotron3_5_asr": (transformers.Nemotron3_5AsrConfig, transformers.Nemotron3_5AsrForRNNT),
}


def clips() -> list[np.ndarray]:
    """Three spans of the JFK recording, of different lengths (11 s, 3 s and 5 s)."""
    full = load_audio(JFK)
    return [full, full[: 16000 * 3], full[16000 * 2 : 16000 * 7]]


def feature_extractor(num_mel_bins: int) -> transformers.NemotronAsrStreamingFeatureExtractor:
    return transformers.NemotronAsrStreamingFeatureExtractor(feature_size=num_mel_bins)


def reference_features(extractor, audio: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference extractor's batch -> (features [B, T, n_mels], lengths [B])."""
    out = extractor(audio, sampling_rate=16000, return_tensors="pt")
    return out.input_features, out.attention_mask.sum(-1)


def build_reference(architecture: str = "nemotron_asr_streaming", prompt_gain: float = 1.0,
                    calibration_prompts: tuple[int, ...] = (), **encoder_fields) -> transformers.PreTrainedModel:
    """The architecture's tiny config as the transformers model, randomized and calibrated; ``encoder_fields``
    override its encoder's. Nemotron 3.5: ``prompt_gain`` scales the prompt projector's one-hot columns, and the
    joint is calibrated on the clips under each of ``calibration_prompts`` (so that each decodes a varied mix,
    not only the default prompt)."""
    config = ARCHITECTURES.get(architecture).tiny_config()
    values = config.to_dict()
    values.pop("model_type")
    values.pop("prompt_dictionary", None)  # the processor's, not the model config's
    values["encoder_config"].update(encoder_fields)
    config_cls, model_cls = _CLASSES[architecture]
    torch.manual_seed(SEED)
    model = model_cls(config_cls(**values, decoder_start_token_id=config.blank_id)).eval()
    randomize_weights(model)
    if architecture == "nemotron3_5_asr":
        bend_by_prompt(model.prompt_projector, config.encoder_config.hidden_size, prompt_gain)
    x, lengths = reference_features(feature_extractor(config.num_mel_bins), clips())
    if calibration_prompts:
        prompt_ids = torch.tensor(calibration_prompts).repeat_interleave(len(lengths))
        num = len(calibration_prompts)
        calibrate_heads(model, "rnnt", BLANK_BIAS, 0.0, calibration=(x.repeat(num, 1, 1), lengths.repeat(num)),
                        prompt_ids=prompt_ids)
    else:
        calibrate_heads(model, "rnnt", BLANK_BIAS, 0.0, calibration=(x, lengths))
    counter_repeats(model, REPEAT_PENALTY)
    return model


@torch.no_grad()
def bend_by_prompt(projector: torch.nn.Module, hidden: int, gain: float) -> None:
    """Makes ``linear_2(relu(linear_1([h, one_hot(p)])))`` the identity, ``relu(h) - relu(-h)``, bent per prompt:
    prompt p adds ``gain`` times its random column of ``linear_1`` before the ReLU, which moves each dimension's
    kinks. A random MLP instead would squash the frames that the random encoder tells apart (blanks throughout)."""
    assert projector.linear_1.out_features == 2 * hidden, "the identity needs an intermediate of twice the width"
    eye = torch.eye(hidden)
    projector.linear_1.weight[:, :hidden] = torch.cat([eye, -eye])
    projector.linear_1.weight[:, hidden:] *= gain
    projector.linear_1.bias.zero_()
    projector.linear_2.weight.copy_(torch.cat([eye, -eye], 1))
    projector.linear_2.bias.zero_()


@torch.no_grad()
def counter_repeats(model: transformers.PreTrainedModel, penalty: float) -> None:
    """Fits ``decoder.decoder_projector`` (least squares) so the predictor's output after the start token then
    token t is ``-penalty`` times t's unit joint row: the token just emitted scores lower at the next step."""
    decoder, config = model.decoder, model.config
    decoder.embedding.weight.mul_(5.0)  # unit-scale inputs, so the LSTM's output tells the tokens apart
    blank, vocab = config.blank_token_id, config.vocab_size
    tokens = torch.stack([torch.full((vocab,), blank), torch.arange(vocab)], 1)
    hidden = decoder.lstm(decoder.embedding(tokens))[0][:, -1]  # [V, H]
    rows = model.joint.head.weight
    target = -penalty * rows / rows.norm(dim=1, keepdim=True)
    target[blank] = 0.0
    solution = torch.linalg.lstsq(torch.cat([hidden, torch.ones(vocab, 1)], 1), target).solution  # [H + 1, H]
    decoder.decoder_projector.weight.copy_(solution[:-1].T)
    decoder.decoder_projector.bias.copy_(solution[-1])


def save(model: transformers.PreTrainedModel, directory: Path) -> Path:
    """The checkpoint as ``save_pretrained`` writes it; Nemotron 3.5's with its processor (``processor_config.json``
    holds the language -> prompt table), which rewrites the same tokenizer."""
    model.save_pretrained(directory)
    extractor = feature_extractor(model.config.encoder_config.num_mel_bins)
    extractor.save_pretrained(directory)
    write_tokenizer(directory / "tokenizer.json", "<blank>")
    if model.config.model_type == "nemotron3_5_asr":
        tokenizer = reference_tokenizer(directory / "tokenizer.json", "<blank>")
        transformers.Nemotron3_5AsrProcessor(extractor, tokenizer).save_pretrained(directory)
    return directory


@torch.no_grad()
def reference_greedy(model, x: torch.Tensor, lengths: torch.Tensor, **inputs) -> list[list[int]]:
    """transformers' offline ``generate``, each row cut where its frame pointer passes its encoder length (it
    keeps stepping exhausted rows), blanks dropped. ``inputs``: more model inputs (Nemotron 3.5's ``prompt_ids``)."""
    mask = attention_mask(lengths)
    config = model.config
    encoder_lengths = model.get_audio_features(input_features=x, attention_mask=mask, **inputs).attention_mask.sum(-1)
    out = model.generate(input_features=x, attention_mask=mask, **inputs,
                         max_new_tokens=int(encoder_lengths.max()) * config.max_symbols_per_step + 1)
    ids = []
    for row, durations, length in zip(out.sequences, out.durations, encoder_lengths, strict=True):
        frame = torch.cumsum(durations, 0) - durations  # the frame each step was taken at
        steps = [int(row[i]) for i in range(1, len(row)) if frame[i] < length]  # step 0 is the start token
        ids.append([t for t in steps if t != config.blank_token_id])
    return ids


def mel_chunks(features: torch.Tensor, lookahead: int, subsampling_factor: int = 8):
    """features [1, T, n_mels] -> the chunks transformers' streaming ``generate`` takes: 1 + 8r frames, then
    8(r + 1) each, the last zero-padded to its size."""
    first, size = 1 + subsampling_factor * lookahead, subsampling_factor * (lookahead + 1)
    yield torch.nn.functional.pad(features[:, :first], (0, 0, 0, max(0, first - features.shape[1])))
    for start in range(first, features.shape[1], size):
        chunk = features[:, start : start + size]
        yield torch.nn.functional.pad(chunk, (0, 0, 0, size - chunk.shape[1]))


@torch.no_grad()
def reference_streamed(model, features: torch.Tensor, lookahead: int, **inputs) -> list[int]:
    """transformers' streaming ``generate`` over one input's real features [1, T, n_mels], blanks dropped.
    ``inputs``: more model inputs (Nemotron 3.5's ``prompt_ids``)."""
    out = model.generate(input_features=mel_chunks(features, lookahead), num_lookahead_tokens=lookahead,
                         max_new_tokens=10**6, **inputs)
    return [t for t in out.sequences[0, 1:].tolist() if t != model.config.blank_token_id]


@dataclass
class Pair:
    """A reference model, its checkpoint loaded by OASR, and the reference extractor's batch of the clips."""

    reference: torch.nn.Module
    loaded: object  # oasr's LoadedModel
    x: torch.Tensor  # the reference extractor's features [B, T, n_mels]
    lengths: torch.Tensor  # [B] real feature frames
    directory: Path  # the saved checkpoint


def make_pair(reference: torch.nn.Module, directory: Path) -> Pair:
    directory = save(reference, directory)
    loaded = oasr.from_pretrained(directory, device="cpu", dtype="float32")
    x, lengths = reference_features(feature_extractor(reference.config.encoder_config.num_mel_bins), clips())
    return Pair(reference, loaded, x, lengths, directory)
