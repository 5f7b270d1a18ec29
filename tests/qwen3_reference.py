"""Tiny random transformers Qwen3-ASR checkpoints, and transformers' own ``generate`` over them, for the parity
tests of ``oasr.models.qwen3_asr``.

A checkpoint directory holds what ``save_pretrained`` writes for ``Qwen3ASRForConditionalGeneration`` and its
feature extractor, plus a byte-level BPE ``tokenizer.json`` (Qwen2's kind: the 256 byte symbols, a few merges)
with the prompt's special tokens under their real names. The reference prompt is the chat text rendered as one
string and tokenized whole by transformers' tokenizer; OASR's prompt builder places the special tokens by id and
tokenizes the text between them, so the two paths meet only in the ids.

Default initialisation (std 0.02) makes every position look alike; ``randomize`` gives the weights unit-gain
scales and the final norm gains of random sign, so the output varies with the audio and from step to step.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from aed_reference import randomize_weights
from oasr.models import ARCHITECTURES
from oasr.models.qwen3_asr.languages import LANGUAGE_NAMES

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|audio_start|>", "<|audio_end|>",
                  "<|audio_pad|>", "<asr_text>")  # ids 256 .. 262, after the byte symbols
MERGES = (("a", "n"), ("e", "n"), ("s", "y"), ("Ġ", "t"), ("l", "a"), ("u", "s"), ("e", "r"), ("a", "g"))
END = "<|im_end|>"
SAMPLE_RATE = 16_000


def write_tokenizer(path: Path) -> Path:
    """Byte-level BPE of 272 ids: 256 byte symbols, the special tokens (256 .. 262), unused 263, then merges."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {symbol: i for i, symbol in enumerate(alphabet)}
    merged = {a + b: 264 + i for i, (a, b) in enumerate(MERGES)}
    specials = {token: 256 + i for i, token in enumerate(SPECIAL_TOKENS)}
    tok = Tokenizer(models.BPE({**vocab, **specials, "<|unused|>": 263, **merged}, list(MERGES)))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    assert [tok.token_to_id(t) for t in SPECIAL_TOKENS] == list(range(256, 263))
    tok.save(str(path))
    return path


def reference_tokenizer(directory: Path) -> transformers.PreTrainedTokenizerFast:
    return transformers.PreTrainedTokenizerFast(tokenizer_file=str(directory / "tokenizer.json"),
                                                eos_token=END, pad_token=END)


def reference_config() -> transformers.Qwen3ASRConfig:
    ours = ARCHITECTURES.get("qwen3_asr").tiny_config().to_dict()
    audio = {k: v for k, v in ours["audio_config"].items() if k != "model_type"}
    text = {k: v for k, v in ours["text_config"].items() if k != "model_type"}
    return transformers.Qwen3ASRConfig(audio_config=audio, text_config=text, audio_token_id=ours["audio_token_id"],
                                       pad_token_id=ours["pad_token_id"], eos_token_id=ours["eos_token_id"])


@torch.no_grad()
def randomize(model: torch.nn.Module) -> None:
    randomize_weights(model)
    model.model.language_model.norm.weight.normal_(0.0, 1.0)


def make_checkpoint(directory: Path, seed: int = 0) -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    config = reference_config()
    model = transformers.Qwen3ASRForConditionalGeneration(config).eval()
    randomize(model)
    model.save_pretrained(directory)
    extractor = transformers.Qwen3ASRFeatureExtractor(feature_size=config.audio_config.num_mel_bins)
    extractor.save_pretrained(directory)
    write_tokenizer(directory / "tokenizer.json")
    return directory


def load_reference(directory: Path) -> transformers.Qwen3ASRForConditionalGeneration:
    return transformers.Qwen3ASRForConditionalGeneration.from_pretrained(directory).eval()


def audio_batch(seconds: tuple[float, ...], seed: int = 0) -> list[np.ndarray]:
    """Noise with a few tones, of different lengths (16 kHz float32)."""
    rng = np.random.default_rng(seed)
    out = []
    for s in seconds:
        t = np.arange(int(SAMPLE_RATE * s)) / SAMPLE_RATE
        tone = sum(np.sin(2 * np.pi * f * t) for f in rng.uniform(100, 4000, size=3))
        out.append((0.1 * tone + 0.05 * rng.standard_normal(len(t))).astype(np.float32))
    return out


def reference_features(audio: np.ndarray, num_mel_bins: int) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' features of one input, as its processor computes them (``padding=True``): ([1, n_mels, T],
    the mask [1, T])."""
    extractor = transformers.Qwen3ASRFeatureExtractor(feature_size=num_mel_bins)
    out = extractor([audio], sampling_rate=SAMPLE_RATE, padding=True, return_attention_mask=True)
    return out["input_features"], out["attention_mask"]


def chat_text(num_audio: int, language: str | None, context: str | None) -> str:
    """The prompt as one string, the way the chat template renders it."""
    head = f"language {LANGUAGE_NAMES[language]}<asr_text>" if language else ""
    return (f"<|im_start|>system\n{context or ''}<|im_end|>\n<|im_start|>user\n<|audio_start|>"
            + "<|audio_pad|>" * num_audio + f"<|audio_end|><|im_end|>\n<|im_start|>assistant\n{head}")


@torch.no_grad()
def reference_generate(directory: Path, audio: list[np.ndarray], *, language: str | None = None,
                       context: str | None = None, max_new_tokens: int = 24, min_new_tokens: int = 0
                       ) -> list[list[int]]:
    """transformers' greedy ``generate`` for each input on its own, ending at any of the checkpoint's
    ``eos_token_id``s: the generated tokens only, without the prompt and the end token."""
    model = load_reference(directory)
    tokenizer = reference_tokenizer(directory)
    ends = model.config.eos_token_id
    ends = list(ends) if isinstance(ends, (list, tuple)) else [ends]
    pad = tokenizer.convert_tokens_to_ids(END)
    rows = []
    for samples in audio:
        features, mask = reference_features(samples, model.config.audio_config.num_mel_bins)
        num_audio = int(transformers.models.qwen3_asr.processing_qwen3_asr.Qwen3ASRProcessor._get_audio_token_length(
            None, mask.sum(-1))[0])
        ids = torch.tensor([tokenizer(chat_text(num_audio, language, context), add_special_tokens=False).input_ids])
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), input_features=features,
                             input_features_mask=mask, do_sample=False, max_new_tokens=max_new_tokens,
                             min_new_tokens=min_new_tokens or None,
                             eos_token_id=ends, pad_token_id=pad)
        row = out[0, ids.shape[1]:].tolist()
        stop = next((i for i, token in enumerate(row) if token in ends), len(row))
        rows.append(row[:stop])
    return rows


def reference_prompt_ids(directory: Path, num_audio: int, language: str | None, context: str | None) -> list[int]:
    return reference_tokenizer(directory)(chat_text(num_audio, language, context), add_special_tokens=False).input_ids
