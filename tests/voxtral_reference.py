"""Tiny random transformers Voxtral checkpoints, and transformers' own ``generate`` over them, for the parity
tests of ``oasr.models.voxtral``.

A checkpoint directory holds what ``save_pretrained`` writes for ``VoxtralForConditionalGeneration`` and its
Whisper feature extractor, plus a ``tekken.json`` (Mistral's vocabulary format, as the real release ships it): 40
control tokens, those the transcription request uses under their real names at their real ids (``<s>`` 1, ``</s>``
2, ``[INST]`` 3, ``[/INST]`` 4, ``[AUDIO]`` 24, ``[BEGIN_AUDIO]`` 25, ``[TRANSCRIBE]`` 34), the 256 byte symbols
and four merges.

The real processor (``VoxtralProcessor.apply_transcription_request``) tokenizes through mistral-common, which
pins numpy below 2.4 on this Python and so cannot join the project's environment. The reference request is
therefore built here as mistral-common's ``InstructTokenizer._encode_instruct_transcription`` builds it
(``<s>[INST][BEGIN_AUDIO][AUDIO]*N[/INST]`` + ``lang:xx`` + ``[TRANSCRIBE]``, N from the audio padded to whole
30 s windows), its text tokenized by transformers' own tekken conversion (``MistralConverter``), and the features
are the processor's (``VoxtralProcessor._retrieve_input_features`` with its default audio arguments); OASR reads
tekken.json through tiktoken, as mistral-common does, so the two paths meet only in the ids.
"""

from __future__ import annotations

import base64
import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
import transformers
from transformers.integrations.mistral.tokenizer import MistralConverter

from aed_reference import randomize_weights
from oasr.models import ARCHITECTURES

SAMPLE_RATE = 16_000
WINDOW_SAMPLES = 30 * SAMPLE_RATE
NUM_SPECIAL = 40
NAMED = {0: "<unk>", 1: "<s>", 2: "</s>", 3: "[INST]", 4: "[/INST]", 11: "<pad>", 24: "[AUDIO]",
         25: "[BEGIN_AUDIO]", 34: "[TRANSCRIBE]"}
MERGES = (b"la", b"ng", b"lang", b"en")
# mistral-common's tekken split pattern (v3 and later).
PATTERN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?"
           r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+"
           r"|\s+(?!\S)|\s+")
# The processor's default audio arguments (VoxtralProcessor.audio_kwargs).
AUDIO_KWARGS = dict(sampling_rate=SAMPLE_RATE, padding=True, truncation=False, pad_to_multiple_of=WINDOW_SAMPLES,
                    return_tensors="pt")


def write_tekken(path: Path) -> Path:
    pieces = [bytes([i]) for i in range(256)] + list(MERGES)
    vocab = [{"rank": i, "token_bytes": base64.b64encode(p).decode(), "token_str": p.decode("latin-1")}
             for i, p in enumerate(pieces)]
    specials = [{"rank": i, "token_str": NAMED.get(i, f"<SPECIAL_{i}>"), "is_control": True}
                for i in range(NUM_SPECIAL)]
    data = {"config": {"pattern": PATTERN, "num_vocab_tokens": len(vocab),
                       "default_vocab_size": NUM_SPECIAL + len(vocab), "default_num_special_tokens": NUM_SPECIAL,
                       "version": "v7"},
            "vocab": vocab, "special_tokens": specials,
            "audio": {"sampling_rate": SAMPLE_RATE, "frame_rate": 12.5, "chunk_length_s": 30.0,
                      "audio_encoding_config": {"num_mel_bins": 16, "hop_length": 160, "window_size": 400}}}
    path.write_text(json.dumps(data))
    return path


def reference_tokenizer(directory: Path):
    return MistralConverter(str(directory / "tekken.json")).converted()


def reference_config() -> transformers.VoxtralConfig:
    ours = ARCHITECTURES.get("voxtral").tiny_config().to_dict()
    audio = {k: v for k, v in ours["audio_config"].items() if k != "model_type"}
    text = {**ours["text_config"], "model_type": "llama", "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 11}
    return transformers.VoxtralConfig(audio_config=audio, text_config=text, audio_token_id=ours["audio_token_id"])


def make_checkpoint(directory: Path, seed: int = 0, extra_end: int | None = None) -> Path:
    """``extra_end``: a second end token in config.json (the checkpoint's ``eos_token_id`` list), so that a random
    model's transcripts end early (they seldom write ``</s>``)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    config = reference_config()
    model = transformers.VoxtralForConditionalGeneration(config).eval()
    randomize_weights(model)
    with torch.no_grad():
        # Unit-scale embeddings leave the audio to dominate the stream and every row repeats one token; larger
        # ones make each step depend on the token before it.
        model.model.language_model.norm.weight.normal_(0.0, 1.0)
        model.model.language_model.embed_tokens.weight.normal_(0.0, 3.0)
    model.save_pretrained(directory)
    if extra_end is not None:
        values = json.loads((directory / "config.json").read_text())
        (directory / "config.json").write_text(json.dumps({**values, "eos_token_id": [2, extra_end]}))
    extractor = transformers.WhisperFeatureExtractor(feature_size=config.audio_config.num_mel_bins)
    extractor.save_pretrained(directory)
    write_tekken(directory / "tekken.json")
    return directory


def load_reference(directory: Path) -> transformers.VoxtralForConditionalGeneration:
    return transformers.VoxtralForConditionalGeneration.from_pretrained(directory).eval()


def audio_batch(seconds: tuple[float, ...], seed: int = 0) -> list[np.ndarray]:
    """Noise with a few tones, of different lengths (16 kHz float32)."""
    rng = np.random.default_rng(seed)
    out = []
    for s in seconds:
        t = np.arange(int(SAMPLE_RATE * s)) / SAMPLE_RATE
        tone = sum(np.sin(2 * np.pi * f * t) for f in rng.uniform(100, 4000, size=3))
        out.append((0.1 * tone + 0.05 * rng.standard_normal(len(t))).astype(np.float32))
    return out


def reference_features(audio: np.ndarray, num_mel_bins: int) -> torch.Tensor:
    """The processor's features of one input: [windows, n_mels, 3000]."""
    extractor = transformers.WhisperFeatureExtractor(feature_size=num_mel_bins)
    processor = SimpleNamespace(feature_extractor=extractor)
    return transformers.VoxtralProcessor._retrieve_input_features(processor, [audio], 3000, **AUDIO_KWARGS)


def num_audio_tokens(num_samples: int) -> int:
    """mistral-common's ``AudioEncoder._encode_audio_tokens`` after its padding to whole 30 s windows."""
    padded = max(1, math.ceil(num_samples / WINDOW_SAMPLES)) * WINDOW_SAMPLES
    return math.ceil((padded // 160) / 8)  # hop 160; 12.5 tokens per second: 8 frames per token


def reference_prompt_ids(directory: Path, num_samples: int, language: str | None) -> list[int]:
    ids = [1, 3, 25] + [24] * num_audio_tokens(num_samples) + [4]
    if language is not None:
        ids += reference_tokenizer(directory).encode(f"lang:{language}", add_special_tokens=False).ids
    return ids + [34]


@torch.no_grad()
def reference_generate(directory: Path, audio: list[np.ndarray], *, language: str | None = None,
                       max_new_tokens: int = 24, ends: tuple[int, ...] = (2,)) -> list[list[int]]:
    """transformers' greedy ``generate`` for each input on its own, ending at any of ``ends``: the generated tokens
    only, without the prompt and the end token."""
    model = load_reference(directory)
    rows = []
    for samples in audio:
        features = reference_features(samples, model.config.audio_config.num_mel_bins)
        ids = torch.tensor([reference_prompt_ids(directory, len(samples), language)])
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), input_features=features,
                             do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=list(ends), pad_token_id=11)
        row = out[0, ids.shape[1]:].tolist()
        rows.append(row[: next((i for i, t in enumerate(row) if t in ends), len(row))])
    return rows
