"""A tiny random transformers Nemotron ASR streaming model (``NemotronAsrStreamingForRNNT``) built from OASR's
tiny config, its feature extractor, and its own offline greedy decoding, for the parity tests.

The weights are randomized and the joint's encoder side calibrated as Parakeet's (``parakeet_reference.randomize``),
on the features the tests decode. On real audio that alone leaves a random predictor too weak to matter: every
frame emits its token max_symbols_per_step times. ``counter_repeats`` sets the predictor's output projection so
that having just emitted a token pushes the joint away from that token, and the reference then emits a varied mix
of tokens and blanks (runs of at most a few).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import transformers

import oasr
from oasr.audio import load_audio
from oasr.models import ARCHITECTURES
from parakeet_reference import attention_mask, randomize, write_tokenizer

JFK = Path(oasr.__file__).parent / "assets" / "jfk.flac"
SEED, BLANK_BIAS, REPEAT_PENALTY = 1, 5.0, 6.0


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


def build_reference(**encoder_fields) -> transformers.NemotronAsrStreamingForRNNT:
    """The tiny config's model, randomized and calibrated; ``encoder_fields`` override its encoder's."""
    config = ARCHITECTURES.get("nemotron_asr_streaming").tiny_config()
    values = config.to_dict()
    values.pop("model_type")
    values["encoder_config"].update(encoder_fields)
    torch.manual_seed(SEED)
    model = transformers.NemotronAsrStreamingForRNNT(
        transformers.NemotronAsrStreamingConfig(**values, decoder_start_token_id=config.blank_id)
    ).eval()
    x, lengths = reference_features(feature_extractor(config.num_mel_bins), clips())
    randomize(model, "rnnt", BLANK_BIAS, 0.0, calibration=(x, lengths))
    counter_repeats(model, REPEAT_PENALTY)
    return model


@torch.no_grad()
def counter_repeats(model: transformers.NemotronAsrStreamingForRNNT, penalty: float) -> None:
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


def save(model: transformers.NemotronAsrStreamingForRNNT, directory: Path) -> Path:
    model.save_pretrained(directory)
    feature_extractor(model.config.encoder_config.num_mel_bins).save_pretrained(directory)
    write_tokenizer(directory / "tokenizer.json", "<blank>")
    return directory


@torch.no_grad()
def reference_greedy(model, x: torch.Tensor, lengths: torch.Tensor) -> list[list[int]]:
    """transformers' offline ``generate``, each row cut where its frame pointer passes its encoder length (it
    keeps stepping exhausted rows), blanks dropped."""
    mask = attention_mask(lengths)
    config = model.config
    encoder_lengths = model.get_audio_features(input_features=x, attention_mask=mask).attention_mask.sum(-1)
    out = model.generate(input_features=x, attention_mask=mask,
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
def reference_streamed(model, features: torch.Tensor, lookahead: int) -> list[int]:
    """transformers' streaming ``generate`` over one input's real features [1, T, n_mels], blanks dropped."""
    out = model.generate(input_features=mel_chunks(features, lookahead), num_lookahead_tokens=lookahead,
                         max_new_tokens=10**6)
    return [t for t in out.sequences[0, 1:].tolist() if t != model.config.blank_token_id]
