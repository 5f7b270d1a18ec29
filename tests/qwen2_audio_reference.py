"""Tiny random transformers Qwen2-Audio checkpoints, and transformers' own processor and ``generate`` over them,
for the parity tests of ``oasr.models.qwen2_audio``.

A checkpoint directory holds what ``save_pretrained`` writes for ``Qwen2AudioForConditionalGeneration`` and its
Whisper feature extractor, plus a byte-level BPE ``tokenizer.json`` (Qwen2's kind) whose special tokens carry their
real names (``<|endoftext|>``, ``<|AUDIO|>``, ``<|audio_bos|>``, ``<|audio_eos|>``, language tokens ``<|en|>``
...). The reference request is the ASR prompt as one string, run through transformers' ``Qwen2AudioProcessor``
(which expands ``<|AUDIO|>`` to the audio's positions and computes the masked features); OASR's prompt builder
places the special tokens by id, so the two paths meet only in the ids.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from aed_reference import randomize_weights
from oasr.models import ARCHITECTURES

SAMPLE_RATE = 16_000
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>",
                  "<|en|>", "<|de|>", "<|fr|>")  # ids 256 .. 264, after the byte symbols
MERGES = (("e", "n"), ("Ġ", "t"), ("h", "e"), ("e", "c"), ("a", "n"), ("Ġ", "s"), ("r", "e"), ("o", "g"))
INSTRUCTION = "Detect the language and recognize the speech: "


def write_tokenizer(path: Path) -> Path:
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {symbol: i for i, symbol in enumerate(alphabet)}
    specials = {token: 256 + i for i, token in enumerate(SPECIAL_TOKENS)}
    merged = {a + b: 265 + i for i, (a, b) in enumerate(MERGES)}
    tok = Tokenizer(models.BPE({**vocab, **specials, **merged}, list(MERGES)))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    assert [tok.token_to_id(t) for t in SPECIAL_TOKENS] == list(range(256, 265))
    tok.save(str(path))
    return path


def reference_tokenizer(directory: Path) -> transformers.PreTrainedTokenizerFast:
    return transformers.PreTrainedTokenizerFast(tokenizer_file=str(directory / "tokenizer.json"),
                                                eos_token="<|endoftext|>", pad_token="<|endoftext|>")


def reference_config() -> transformers.Qwen2AudioConfig:
    ours = ARCHITECTURES.get("qwen2_audio").tiny_config().to_dict()
    audio = {k: v for k, v in ours["audio_config"].items() if k != "model_type"}
    text = {**ours["text_config"], "model_type": "qwen2", "eos_token_id": 256, "pad_token_id": 256}
    return transformers.Qwen2AudioConfig(audio_config=audio, text_config=text,
                                         audio_token_index=ours["audio_token_index"])


def make_checkpoint(directory: Path, seed: int = 0, extra_end: int | None = None) -> Path:
    """``extra_end``: a second end token in config.json (``eos_token_id``), so that a random model's transcripts
    end early (they seldom write ``<|endoftext|>``)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = transformers.Qwen2AudioForConditionalGeneration(reference_config()).eval()
    randomize_weights(model)
    with torch.no_grad():  # see voxtral_reference: token-dependent steps, not one repeated token
        model.model.language_model.norm.weight.normal_(0.0, 1.0)
        model.model.language_model.embed_tokens.weight.normal_(0.0, 3.0)
    model.save_pretrained(directory)
    if extra_end is not None:
        values = json.loads((directory / "config.json").read_text())
        (directory / "config.json").write_text(json.dumps({**values, "eos_token_id": [256, extra_end]}))
    transformers.WhisperFeatureExtractor(feature_size=16).save_pretrained(directory)
    write_tokenizer(directory / "tokenizer.json")
    return directory


def load_reference(directory: Path) -> transformers.Qwen2AudioForConditionalGeneration:
    return transformers.Qwen2AudioForConditionalGeneration.from_pretrained(directory).eval()


def processor(directory: Path) -> transformers.Qwen2AudioProcessor:
    return transformers.Qwen2AudioProcessor(transformers.WhisperFeatureExtractor(feature_size=16),
                                            reference_tokenizer(directory))


def prompt_text(language: str | None) -> str:
    return "<|audio_bos|><|AUDIO|><|audio_eos|>" + INSTRUCTION + (f"<|{language}|>" if language else "")


def reference_inputs(directory: Path, audio: np.ndarray, language: str | None):
    return processor(directory)(text=prompt_text(language), audio=[audio], sampling_rate=SAMPLE_RATE,
                                return_tensors="pt")


def audio_batch(seconds: tuple[float, ...], seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for s in seconds:
        t = np.arange(int(SAMPLE_RATE * s)) / SAMPLE_RATE
        tone = sum(np.sin(2 * np.pi * f * t) for f in rng.uniform(100, 4000, size=3))
        out.append((0.1 * tone + 0.05 * rng.standard_normal(len(t))).astype(np.float32))
    return out


@torch.no_grad()
def reference_generate(directory: Path, audio: list[np.ndarray], *, language: str | None = None,
                       max_new_tokens: int = 24, ends: tuple[int, ...] = (256,)) -> list[list[int]]:
    """transformers' greedy ``generate`` for each input on its own, ending at any of ``ends``: the generated tokens
    only, without the prompt and the end token."""
    model = load_reference(directory)
    rows = []
    for samples in audio:
        inputs = reference_inputs(directory, samples, language)
        out = model.generate(**inputs, do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=list(ends),
                             pad_token_id=256)
        row = out[0, inputs["input_ids"].shape[1]:].tolist()
        rows.append(row[: next((i for i, t in enumerate(row) if t in ends), len(row))])
    return rows
