"""Tiny random transformers Canary and Cohere Transcribe checkpoints, and transformers' own generate over them,
for the parity tests of ``oasr.models.canary`` (and the engine's, on top of these).

A checkpoint directory holds what ``save_pretrained`` writes for the model and its feature extractor, plus a
``tokenizer.json`` with the prompt's special tokens under their real names and four languages. The ids of the
first special tokens follow the real vocabularies (pad 2, end 3, start of transcript 4, start of context 7) so the
configs' token ids hold; the prompt builder finds every one by name.

Default initialisation (std 0.02) makes every position look alike, so greedy decoding repeats one token.
``randomize`` gives the weights unit-gain scales, and the decoder's final norm gains of random sign: the residual
stream carries the current token's own embedding, which a tied head (Canary's) would otherwise score highest at
every step. With them the output varies with the audio and from step to step, and rows end at different steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from oasr.layers.attention import sdpa
from oasr.layers.cache import DenseCross, FullContext
from oasr.models import ARCHITECTURES
import oasr
from oasr.models.loader import LoadedModel

LANGUAGES = ("en", "de", "fr", "es")
# Piece order = id order. Specials hold the real vocabularies' first ids; the rest are plain text pieces.
SPECIAL_TOKENS = (
    "<unk>", "<|nospeech|>", "<pad>", "<|endoftext|>", "<|startoftranscript|>", "<|pnc|>", "<|nopnc|>",
    "<|startofcontext|>", "<|itn|>", "<|noitn|>", "<|timestamp|>", "<|notimestamp|>", "<|diarize|>",
    "<|nodiarize|>", "<|spkchange|>", "<|audioseparator|>", "<|emo:undefined|>", "<|emo:neutral|>",
    *(f"<|{lang}|>" for lang in LANGUAGES),
)  # fmt: skip
TEXT_PIECES = ("\u2581", "\u2581the", "\u2581a", "\u2581cat", "\u2581dog", "\u2581is", "\u2581on", "\u2581der", "s",
               "t", "e", "a", "o", "n", "r", "i", "l", "d", "c", "<", "|", ">", "u", "p", ".", ",")  # fmt: skip
# Scores of the special pieces in the unigram model: far below any spelling of their names from text pieces, as
# SentencePiece never produces control symbols from text.
_SPECIAL_SCORE = -1e4
AUDIO_SECONDS = (1.0, 0.73, 0.41)  # the test batch: 100, 73 and 41 feature frames


def write_tokenizer(path: Path) -> Path:
    """A SentencePiece-style (Metaspace) unigram vocabulary of 48 ids, the special tokens registered as such."""
    pieces = [*SPECIAL_TOKENS, *TEXT_PIECES]
    scores = [_SPECIAL_SCORE] * len(SPECIAL_TOKENS) + [-float(i) for i in range(len(TEXT_PIECES))]
    tok = Tokenizer(models.Unigram(list(zip(pieces, scores, strict=True)), unk_id=0))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    assert tok.get_vocab_size(with_added_tokens=True) == len(pieces) == 48
    assert tok.token_to_id("<|startofcontext|>") == 7 and tok.token_to_id("<|endoftext|>") == 3
    tok.save(str(path))
    return path


def reference_tokenizer(directory: Path) -> transformers.PreTrainedTokenizerFast:
    return transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(directory / "tokenizer.json"), unk_token="<unk>", pad_token="<pad>",
        eos_token="<|endoftext|>", bos_token="<|startoftranscript|>",
    )


def _canary_config() -> transformers.CanaryConfig:
    ours = ARCHITECTURES.get("canary").tiny_config().to_dict()
    decoder = transformers.CanaryDecoderConfig(**ours["decoder_config"])
    encoder = transformers.ParakeetEncoderConfig(**ours["encoder_config"])
    return transformers.CanaryConfig(
        encoder_config=encoder, decoder_config=decoder, vocab_size=decoder.vocab_size, tie_word_embeddings=True
    )


def _cohere_config() -> transformers.CohereAsrConfig:
    ours = ARCHITECTURES.get("cohere_asr").tiny_config().to_dict()
    decoder_keys = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                    "num_key_value_heads", "head_dim", "hidden_act", "max_position_embeddings", "attention_bias")
    return transformers.CohereAsrConfig(
        encoder_config=ours["encoder_config"], **{k: ours[k] for k in decoder_keys}, tie_word_embeddings=False,
        # generate prepends the start token (else the bos token) to a prompt that does not begin with it; the
        # prompt begins with the word boundary '▁'.
        decoder_start_token_id=len(SPECIAL_TOKENS) + TEXT_PIECES.index("\u2581"),
    )


@torch.no_grad()
def randomize(model: torch.nn.Module) -> None:
    randomize_weights(model)
    model.model.decoder.norm.weight.normal_(0.0, 1.0)


@torch.no_grad()
def randomize_weights(model: torch.nn.Module) -> None:
    """Every weight at unit-scale outputs, norms and biases moved off their defaults, batch-norm statistics set."""
    for name, p in model.named_parameters():
        if p.dim() >= 2:
            p.normal_(0.0, p[0].numel() ** -0.5)
        elif "norm" in name:
            p.add_(0.1 * torch.randn_like(p))
        elif "bias" in name:
            p.normal_(0.0, 0.1)
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm1d):
            module.running_mean.normal_(0.0, 0.1)
            module.running_var.uniform_(0.5, 1.5)


def _make_checkpoint(kind: str, directory: Path, seed: int) -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    if kind == "canary":
        config = _canary_config()
        model = transformers.CanaryForConditionalGeneration(config).eval()
        extractor = transformers.ParakeetFeatureExtractor(feature_size=config.encoder_config.num_mel_bins)
    else:
        config = _cohere_config()
        model = transformers.CohereAsrForConditionalGeneration(config).eval()
        extractor = transformers.CohereAsrFeatureExtractor(feature_size=config.encoder_config.num_mel_bins)
    randomize(model)
    model.save_pretrained(directory)
    extractor.save_pretrained(directory)
    write_tokenizer(directory / "tokenizer.json")
    return directory


def make_canary_checkpoint(directory: Path, seed: int = 0) -> Path:
    """A tiny random ``CanaryForConditionalGeneration`` saved to ``directory`` (with its feature extractor and
    tokenizer); returns the directory. The default seeds of both makers give, for ``audio_batch()`` and 20 new
    tokens, greedy rows that differ and end at different steps (Canary's: at the limit, after 11, at once)."""
    return _make_checkpoint("canary", directory, seed)


def make_cohere_checkpoint(directory: Path, seed: int = 1) -> Path:
    """A tiny random ``CohereAsrForConditionalGeneration`` saved to ``directory``; returns the directory."""
    return _make_checkpoint("cohere_asr", directory, seed)


def load_reference(directory: Path) -> torch.nn.Module:
    model_type = transformers.AutoConfig.from_pretrained(directory).model_type
    cls = {"canary": transformers.CanaryForConditionalGeneration,
           "cohere_asr": transformers.CohereAsrForConditionalGeneration}[model_type]
    return cls.from_pretrained(directory).eval()


def audio_batch(seed: int = 0, seconds: tuple[float, ...] = AUDIO_SECONDS) -> list[np.ndarray]:
    """Noise with a few tones, of different lengths (16 kHz float32)."""
    rng = np.random.default_rng(seed)
    out = []
    for s in seconds:
        t = np.arange(int(16_000 * s)) / 16_000
        tone = sum(np.sin(2 * np.pi * f * t) for f in rng.uniform(100, 4000, size=3))
        out.append((0.1 * tone + 0.05 * rng.standard_normal(len(t))).astype(np.float32))
    return out


def reference_features(directory: Path, audio_list: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' features of ``audio_list``: ([B, T, n_mels], attention mask [B, T])."""
    extractor = transformers.AutoFeatureExtractor.from_pretrained(directory)
    out = extractor(audio_list, sampling_rate=16_000, return_tensors="pt", return_attention_mask=True)
    return out["input_features"], out["attention_mask"]


@torch.no_grad()
def reference_generate(
    directory: Path,
    audio_list: list[np.ndarray],
    prompt_ids: list[int] | tuple[int, ...],
    num_beams: int = 1,
    max_new_tokens: int = 24,
) -> list[list[int]]:
    """transformers' ``generate`` (greedy or beam search, no sampling) from ``prompt_ids`` for each input: the
    generated tokens only, without the prompt and without the end token (nor the padding after it)."""
    model = load_reference(directory)
    features, mask = reference_features(directory, audio_list)
    prompt = torch.tensor([list(prompt_ids)] * len(audio_list))
    out = model.generate(
        input_features=features, attention_mask=mask, decoder_input_ids=prompt, do_sample=False,
        num_beams=num_beams, max_new_tokens=max_new_tokens,
    )
    # generate would have put its start token in front of a prompt that does not begin with it.
    assert torch.equal(out[:, : prompt.shape[1]], prompt), "transformers changed the prompt"
    end = model.config.eos_token_id
    rows = []
    for row in out[:, prompt.shape[1]:].tolist():
        rows.append(row[: row.index(end)] if end in row else row)
    return rows


class AppendCache:
    """A dense self-attention cache that grows by what each call brings (the engine's pool, minus the paging)."""

    def __init__(self) -> None:
        self.k: dict[int, torch.Tensor] = {}
        self.v: dict[int, torch.Tensor] = {}

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
               use_kernel: bool = False) -> torch.Tensor:
        if layer in self.k:
            k, v = torch.cat([self.k[layer], k], dim=2), torch.cat([self.v[layer], v], dim=2)
        self.k[layer], self.v[layer] = k, v
        new, total = q.shape[2], k.shape[2]
        mask = torch.arange(total)[None, :] <= torch.arange(total - new, total)[:, None]
        return sdpa(q, k, v, mask=mask[None, None])


@torch.no_grad()
def oasr_greedy(loaded: LoadedModel, audio_list: list[np.ndarray], prompt_ids: tuple[int, ...], max_new_tokens: int,
                end_token: int) -> list[list[int]]:
    """A plain greedy loop over OASR's model, without a cache: each step runs the whole prefix through
    ``decode_hidden`` (``FullContext`` / ``DenseCross``) and appends the argmax of the last position. Rows stop at
    ``end_token`` (not kept) or after ``max_new_tokens``."""
    model = loaded.model
    features, lengths = loaded.features(audio_list)
    encoded = model.encode(features, lengths)
    cross = DenseCross(*model.cross_kv(encoded.hidden), encoded.lengths)
    tokens = torch.tensor([list(prompt_ids)] * len(audio_list))
    done = torch.zeros(len(audio_list), dtype=torch.bool)
    out: list[list[int]] = [[] for _ in audio_list]
    for _ in range(max_new_tokens):
        positions = torch.arange(tokens.shape[1]).expand_as(tokens)
        hidden = model.decode_hidden(tokens, positions, FullContext(), cross)
        step = model.logits(hidden[:, -1]).argmax(-1)
        for row, token in enumerate(step.tolist()):
            if not done[row]:
                if token == end_token:
                    done[row] = True
                else:
                    out[row].append(token)
        if done.all():
            break
        tokens = torch.cat([tokens, step[:, None]], dim=1)
    return out


@dataclass
class Pair:
    """One tiny checkpoint as transformers and OASR each load it, with transformers' features of ``audio_batch``."""

    directory: Path
    family: str  # the prompt builder's family name
    reference: torch.nn.Module
    loaded: LoadedModel
    x: torch.Tensor  # transformers' features [B, T, n_mels]
    mask: torch.Tensor  # [B, T]

    @property
    def lengths(self) -> torch.Tensor:
        return self.mask.sum(-1)

    def prompter(self):
        return self.loaded.model.prompt_builder(self.loaded.config, self.loaded.tokenizer, self.family)


def make_pair(directory: Path, family: str) -> Pair:
    x, mask = reference_features(directory, audio_batch())
    return Pair(directory, family, load_reference(directory),
                oasr.from_pretrained(directory, device="cpu", dtype="float32"), x, mask)
