"""Tiny random transformers Granite Speech checkpoints, and transformers' own processor and ``generate`` over them,
for the parity tests of ``oasr.models.granite_speech``.

A checkpoint directory holds what ``save_pretrained`` writes for ``GraniteSpeechForConditionalGeneration`` (no
LoRA adapter) plus a byte-level BPE ``tokenizer.json`` whose special tokens carry their real names
(``<|end_of_text|>``, ``<|start_of_role|>``, ``<|end_of_role|>``, ``<|audio|>``). The reference request is the chat
text run through transformers' ``GraniteSpeechProcessor``, which expands ``<|audio|>`` to the audio's positions.

transformers' feature extractor computes its mel spectrogram with torchaudio, which cannot join this environment
(its wheels pin their own torch build). ``reference_extractor`` hands it a stand-in for
``torchaudio.transforms.MelSpectrogram`` built from transformers' own ``audio_utils`` (``spectrogram`` with an
HTK ``mel_filter_bank``, the window centred in the FFT frame as torch.stft places it); everything after the mel
spectrogram (log, floor, frame stacking, the audio-position count) is transformers' code.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import audio_utils
from transformers.models.granite_speech import feature_extraction_granite_speech as granite_features

from aed_reference import randomize_weights
from oasr.models import ARCHITECTURES

SAMPLE_RATE = 16_000
SPECIAL_TOKENS = ("<|end_of_text|>", "<|start_of_role|>", "<|end_of_role|>", "<|audio|>")  # ids 256 .. 259
MERGES = (("e", "n"), ("Ġ", "t"), ("h", "e"), ("o", "r"), ("a", "n"), ("Ġ", "s"), ("r", "e"), ("a", "t"))
SYSTEM = "Knowledge Cutoff Date: April 2024.\nYou are Granite, developed by IBM. You are a helpful AI assistant"
REQUEST = "can you transcribe the speech into a written format?"


def write_tokenizer(path: Path) -> Path:
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {symbol: i for i, symbol in enumerate(alphabet)}
    specials = {token: 256 + i for i, token in enumerate(SPECIAL_TOKENS)}
    merged = {a + b: 260 + i for i, (a, b) in enumerate(MERGES)}
    tok = Tokenizer(models.BPE({**vocab, **specials, **merged}, list(MERGES)))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    tok.save(str(path))
    return path


def reference_tokenizer(directory: Path) -> transformers.PreTrainedTokenizerFast:
    return transformers.PreTrainedTokenizerFast(tokenizer_file=str(directory / "tokenizer.json"),
                                                eos_token="<|end_of_text|>", pad_token="<|end_of_text|>")


def reference_config() -> transformers.GraniteSpeechConfig:
    ours = ARCHITECTURES.get("granite_speech").tiny_config().to_dict()
    encoder = {k: v for k, v in ours["encoder_config"].items() if k != "model_type"}
    projector = {k: v for k, v in ours["projector_config"].items() if k != "model_type"}
    text = {**ours["text_config"], "model_type": "granite", "eos_token_id": 256, "pad_token_id": 256}
    return transformers.GraniteSpeechConfig(encoder_config=encoder, projector_config=projector, text_config=text,
                                            audio_token_index=ours["audio_token_index"], has_lora_adapter=False,
                                            window_size=ours["window_size"], downsample_rate=ours["downsample_rate"])


def make_checkpoint(directory: Path, seed: int = 1, extra_end: int | None = None) -> Path:
    """``extra_end``: a second end token in config.json, so that a random model's transcripts end early."""
    import json

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = transformers.GraniteSpeechForConditionalGeneration(reference_config()).eval()
    randomize_weights(model)
    with torch.no_grad():
        # Granite multiplies every embedding by 12: small token embeddings keep the audio in charge of the
        # stream, so that rows differ from input to input (and the seed gives rows that do not repeat one token).
        model.model.language_model.norm.weight.normal_(0.0, 1.0)
        model.model.language_model.embed_tokens.weight.normal_(0.0, 0.03)
        model.model.projector.query.normal_(0.0, 1.0)
    model.save_pretrained(directory)
    if extra_end is not None:
        values = json.loads((directory / "config.json").read_text())
        (directory / "config.json").write_text(json.dumps({**values, "eos_token_id": [256, extra_end]}))
    write_tokenizer(directory / "tokenizer.json")
    return directory


def load_reference(directory: Path) -> transformers.GraniteSpeechForConditionalGeneration:
    return transformers.GraniteSpeechForConditionalGeneration.from_pretrained(directory).eval()


class _MelSpectrogram:
    """torchaudio.transforms.MelSpectrogram(sample_rate=16000, n_fft=512, win_length=400, hop_length=160,
    n_mels=80) from transformers' audio_utils: [B, N] -> power mel spectrogram [B, 80, N // 160 + 1]."""

    def __init__(self) -> None:
        self.window = audio_utils.window_function(400, "hann", periodic=True, frame_length=512, center=True)
        self.filters = audio_utils.mel_filter_bank(num_frequency_bins=257, num_mel_filters=80, min_frequency=0.0,
                                                   max_frequency=8000.0, sampling_rate=SAMPLE_RATE, norm=None,
                                                   mel_scale="htk")

    def to(self, device):
        return self

    def __call__(self, audio: torch.Tensor) -> torch.Tensor:
        rows = [audio_utils.spectrogram(row.double().numpy(), self.window, frame_length=512, hop_length=160,
                                        fft_length=512, power=2.0, center=True, pad_mode="reflect",
                                        mel_filters=self.filters, mel_floor=0.0) for row in audio]
        return torch.from_numpy(np.stack(rows)).float()


@contextlib.contextmanager
def _without_torchaudio():
    saved = granite_features.requires_backends
    granite_features.requires_backends = lambda *args, **kwargs: None
    try:
        yield
    finally:
        granite_features.requires_backends = saved


def reference_extractor() -> granite_features.GraniteSpeechFeatureExtractor:
    with _without_torchaudio():
        granite_features.torchaudio = type("torchaudio", (), {"transforms": type("transforms", (), {
            "MelSpectrogram": staticmethod(lambda **kwargs: _MelSpectrogram())})})
        return granite_features.GraniteSpeechFeatureExtractor()


def prompt_text() -> str:
    return (f"<|start_of_role|>system<|end_of_role|>{SYSTEM}<|end_of_text|>\n"
            f"<|start_of_role|>user<|end_of_role|><|audio|>{REQUEST}<|end_of_text|>\n"
            "<|start_of_role|>assistant<|end_of_role|>")


def reference_inputs(directory: Path, audio: np.ndarray):
    processor = transformers.GraniteSpeechProcessor(reference_extractor(), reference_tokenizer(directory))
    with _without_torchaudio():
        return processor(prompt_text(), [torch.from_numpy(audio)], return_tensors="pt")


def audio_batch(seconds: tuple[float, ...], seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for s in seconds:
        t = np.arange(int(SAMPLE_RATE * s)) / SAMPLE_RATE
        tone = sum(np.sin(2 * np.pi * f * t) for f in rng.uniform(100, 4000, size=3))
        out.append((0.1 * tone + 0.05 * rng.standard_normal(len(t))).astype(np.float32))
    return out


@torch.no_grad()
def reference_generate(directory: Path, audio: list[np.ndarray], *, max_new_tokens: int = 24,
                       ends: tuple[int, ...] = (256,)) -> list[list[int]]:
    """transformers' greedy ``generate`` for each input on its own, ending at any of ``ends``: the generated tokens
    only, without the prompt and the end token."""
    model = load_reference(directory)
    rows = []
    for samples in audio:
        inputs = reference_inputs(directory, samples)
        inputs.pop("audio_embed_sizes", None)
        out = model.generate(**inputs, do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=list(ends),
                             pad_token_id=256)
        row = out[0, inputs["input_ids"].shape[1]:].tolist()
        rows.append(row[: next((i for i, t in enumerate(row) if t in ends), len(row))])
    return rows
