"""Builds the tiny ``.nemo`` archives of tests/data/nemo/ with nemo-toolkit's own classes and records NeMo's own
greedy tokens for them (the goldens tests/test_nemo_archives.py compares OASR against).

Run with the nemo venv's python (scripts/setup_oracles.sh makes it), from the repository root:

    /tmp/oracle/nemo/bin/python scripts/nemo_oracle/build_archives.py tests/data/nemo

Each model is built from a config in NeMo's layout (the families OASR serves: CTC, RNN-T, TDT, hybrid RNN-T + CTC,
cache-aware streaming FastConformer, Canary multitask AED), its weights re-drawn at unit gain (NeMo's own
initialisation makes a tiny random model emit nothing but blanks), written with ``save_to`` and transcribed with
``transcribe()`` (greedy, batch of one) on a few cuts of oasr/assets/jfk.flac. The streaming one is also run
through NeMo's cache-aware streaming loop (``conformer_stream_step``). Nothing here is imported by the tests.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import soundfile as sf
import torch
from omegaconf import OmegaConf

sys.path.insert(0, str(Path(__file__).resolve().parent))
from configs import FAMILIES, Family, write_tokenizer  # noqa: E402
from prompts import prompt_ids  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
JFK = REPO / "oasr" / "assets" / "jfk.flac"
# (start, seconds) cuts of jfk.flac: three lengths, so padding and length handling are exercised.
CUTS = ((0.3, 1.5), (2.5, 2.4), (6.0, 3.6))
RATE = 16_000


def write_clips(out: Path) -> list[np.ndarray]:
    """The cuts, mono at 16 kHz, as 16-bit FLAC files beside the archives (the tests' input), and as NeMo reads
    them back: both sides start from the same samples, whatever resampler made them."""
    from scipy.signal import resample_poly

    audio, rate = sf.read(JFK, dtype="float32")
    mono = resample_poly(audio.mean(axis=1), RATE, rate).astype(np.float32)
    clips = []
    for index, (start, seconds) in enumerate(CUTS):
        path = out / f"clip{index}.flac"
        sf.write(path, mono[int(start * RATE): int((start + seconds) * RATE)], RATE, subtype="PCM_16")
        clips.append(sf.read(path, dtype="float32")[0])
    return clips


def randomize(model: torch.nn.Module, seed: int) -> None:
    """Unit-gain weights, small random biases and batch-norm statistics: outputs that vary with the audio."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            if tensor.dim() >= 2:
                fan_in = tensor[0].numel()
                tensor.copy_(torch.randn(tensor.shape, generator=generator) / fan_in**0.5)
            elif "norm" in name and name.endswith("weight"):
                tensor.copy_(1 + 0.2 * torch.randn(tensor.shape, generator=generator))
            else:
                tensor.copy_(0.1 * torch.randn(tensor.shape, generator=generator))
        for name, buffer in model.named_buffers():
            if name.endswith("running_mean"):
                buffer.copy_(0.1 * torch.randn(buffer.shape, generator=generator))
            elif name.endswith("running_var"):
                buffer.copy_(0.5 + torch.rand(buffer.shape, generator=generator))


def token_lists(hypotheses, ctc_blank: int | None) -> tuple[list[list[int]], list[str]]:
    """(token ids, text) of each hypothesis. A CTC hypothesis holds its frame-level labels (or log-probabilities):
    they are collapsed here as NeMo's CTC decoding does (repeats merged, blanks dropped)."""
    if isinstance(hypotheses, tuple):  # some model classes return (best, all)
        hypotheses = hypotheses[0]
    tokens = []
    for h in hypotheses:
        labels = h.y_sequence
        if ctc_blank is None:
            tokens.append([int(t) for t in labels])
            continue
        if labels.dim() == 2:
            labels = labels.argmax(dim=-1)
        labels = labels.tolist()[: h.length if h.length > 0 else None]
        previous, kept = ctc_blank, []
        for label in labels:
            if label != ctc_blank and label != previous:
                kept.append(label)
            previous = label
        tokens.append(kept)
    return tokens, [h.text for h in hypotheses]


def build(family: Family, tokenizer_dir: Path, out: Path, audio: list[np.ndarray]) -> dict:
    cfg = OmegaConf.create(family.config(str(tokenizer_dir)))
    model = family.model_class()(cfg=cfg)
    randomize(model, family.seed)
    family.adjust(model)
    if family.fitted:
        from fit import fit_canary, fit_transducer

        if family.prompts:
            fit_canary(model, audio, family.prompts)
        else:
            fit_transducer(model, audio)
    model.eval()
    archive = out / f"{family.name}.nemo"
    model.save_to(str(archive))
    golden = {"archive": archive.name, "target": cfg.get("target") or type(model).__module__ + "." + type(model).__name__,
              "cuts": [list(c) for c in CUTS]}
    with torch.inference_mode():
        hypotheses = model.transcribe(audio, batch_size=1, return_hypotheses=True, **family.transcribe_kwargs)
        golden["tokens"], golden["texts"] = token_lists(hypotheses, family.ctc_blank(model))
        for prompt in family.prompts:  # a multitask model: one golden per prompt (languages, punctuation)
            hypotheses = model.transcribe(audio, batch_size=1, return_hypotheses=True, **prompt)
            tokens, texts = token_lists(hypotheses, None)
            golden.setdefault("prompts", []).append({"prompt": prompt, "prompt_ids": prompt_ids(model, prompt),
                                                     "tokens": tokens, "texts": texts})
        if family.streaming is not None:
            golden["streamed_tokens"] = [family.streaming(model, clip) for clip in audio]
    return golden


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--only", nargs="*", help="family names to build (default: all)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    audio = write_clips(args.out)
    for family in FAMILIES:
        if args.only and family.name not in args.only:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            tokenizer_dir = write_tokenizer(Path(tmp), family.special_tokens)
            golden = build(family, tokenizer_dir, args.out, audio)
        (args.out / f"{family.name}.json").write_text(json.dumps(golden) + "\n")
        print(family.name, golden["tokens"], golden.get("streamed_tokens", ""))


if __name__ == "__main__":
    main()
