"""CTC beam search with a 3-gram KenLM at Parakeet CTC-1.1b shapes (random weights): OASR's word-level beam
(``oasr.decode.ctc_lexicon_beam``) against OASR's greedy decoding in the same run (issue 39's target: the beam
costs under 2x greedy), and against pyctcdecode on the CPU over the same log-probs when it is importable.

H200 (one command; prints one JSON line). OASR reads the ARPA file into device tables itself; kenlm (the ``lm``
extra) is needed only by pyctcdecode, below: where the machine lacks it, carry its build (kenlm 0.3.0 for the
machine's Python; ``wheels/kenlm/`` here holds this checkout's CPython 3.11 build, the one self-contained module
``kenlm.cpython-311-x86_64-linux-gnu.so``, 8 MB) and put its folder on PYTHONPATH. It runs greedy and beam once
to warm up, ``--rounds`` times each timed, and a beam of 1 once; ``--rounds 1`` if the 10-minute limit is near.
``--no-cuda-graphs`` runs the beam's frames (and the other decode steps) eagerly::

    PYTHONPATH=$PWD:$PWD/wheels/kenlm python -m oasr.bench.ctc_lm --arch parakeet-ctc-1.1b \
        --num-utterances 1024 --device cuda

With the pyctcdecode comparison: pyctcdecode is not an OASR dependency (installing it into the project's venv
downgrades numpy). Its two pure-Python wheels (pyctcdecode-0.5.0-py2.py3-none-any.whl, 39 KB, and
pygtrie-2.6.2-py3-none-any.whl, 33 KB; ``pip download pyctcdecode==0.5.0 pygtrie==2.6.2 --no-deps``) import
straight from the wheel files, so carrying them is enough, no pip needed::

    PYTHONPATH=$PWD:$PWD/wheels/kenlm:$PWD/wheels/pyctc/pyctcdecode-0.5.0-py2.py3-none-any.whl:\
$PWD/wheels/pyctc/pygtrie-2.6.2-py3-none-any.whl \
        python -m oasr.bench.ctc_lm --arch parakeet-ctc-1.1b --num-utterances 1024 --device cuda

Without it the JSON says ``"pyctcdecode": {"skipped": "..."}``. pyctcdecode runs over ``--pyctcdecode-clips``
clips (default 256: it searches on the host, one clip at a time per process) in a pool of ``--cpu-workers``
processes; the comparison is by throughput (audio seconds per second). Its ``alpha``/``beta`` are given the
same values as ``--lm-weight``/``--word-bonus`` but weigh natural-log scores and search without a lexicon, so
its words differ: it is a speed reference, not a parity check (tests/test_ctc_lm.py checks parity against
flashlight-text). The timed OASR runs are whole-engine (features, encoder, search) for both greedy and beam.

OASR's search prunes as flashlight's LexiconDecoder does, with ``--beam-size-token`` and ``--beam-threshold``
passed to it as they are; unset, the engine's defaults apply (16 tokens and 20, NeMo's). torchaudio's defaults
(every token, 50) are ``--beam-size-token 100000 --beam-threshold 50``. pyctcdecode keeps its own defaults (it
skips tokens below log-prob -5 and drops beams 10 below the best). On CUDA the search's frame is compiled
(``--no-compile-word-beam`` runs it as captured eager kernels); the warm-up round pays the compilation.

The tokenizer is a Metaspace unigram vocabulary whose words are spelled by one word-start piece and zero to two
continuation pieces, so the lexicon's words take 1-3 tokens as BPE words do. The 3-gram ARPA file is counted from a
seeded Zipf-distributed corpus over ``--num-words`` words and written here (no lmplz needed). Audio is noise of
2-20 s as in the other benches; random weights make its content irrelevant, both decoders see the same frames.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from oasr.bench.parakeet import PARAKEET_SHAPES, sync, synthetic_audio
from oasr.engine.config import SchedulerConfig
from oasr.decode.lexicon import arpa_unigrams

# A CPU smoke shape; "parakeet-ctc-*" are the published ones (oasr.bench.parakeet).
TINY_CTC = ("ctc", dict(hidden_size=64, num_attention_heads=4, intermediate_size=128, conv_kernel_size=9,
                        subsampling_conv_channels=32, num_hidden_layers=2, num_mel_bins=80),
            dict(vocab_size=65, pad_token_id=64))
CTC_SHAPES = {"tiny": TINY_CTC, **{k: v for k, v in PARAKEET_SHAPES.items() if v[0] == "ctc"}}


def word_pieces(vocab_size: int) -> tuple[list[str], list[str]]:
    """Word-start and continuation pieces sharing the ``vocab_size - 2`` ids between <unk> (0) and the blank."""
    num_pieces = vocab_size - 2
    starts = [f"\u2581a{i}" for i in range(num_pieces // 2)]
    return starts, [f"z{i}" for i in range(num_pieces - len(starts))]


def write_tokenizer(path: Path, vocab_size: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    starts, continuations = word_pieces(vocab_size)
    tok = Tokenizer(models.Unigram([(p, -1.0) for p in ["<unk>", *starts, *continuations]], unk_id=0))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.add_special_tokens(["<blank>"])
    tok.save(str(path))


def lexicon_words(vocab_size: int, num_words: int, seed: int = 0) -> list[str]:
    """``num_words`` distinct words of 1-3 pieces (about a third of each length)."""
    starts, continuations = word_pieces(vocab_size)
    rng = np.random.default_rng(seed)
    words: dict[str, None] = {}
    while len(words) < num_words:
        length = int(rng.integers(0, 3))
        tail = "".join(continuations[int(i)] for i in rng.integers(0, len(continuations), length))
        words[starts[int(rng.integers(0, len(starts)))][1:] + tail] = None
    return list(words)


def write_trigram_arpa(path: Path, words: list[str], *, num_sentences: int, seed: int = 0) -> Path:
    """A 3-gram ARPA file counted from a seeded corpus with Zipf word frequencies: every order holds what it saw,
    at half its relative frequency given its context (unigrams add-one over the vocabulary), and each context
    backs off by log10 0.5. Not a tuned model, a valid one whose scores differ from word to word and history to
    history, with the n-gram counts of a small domain LM."""
    rng = np.random.default_rng(seed)
    zipf = 1.0 / np.arange(1, len(words) + 1)
    picks = rng.choice(len(words), size=num_sentences * 12, p=zipf / zipf.sum())
    lengths = rng.integers(3, 13, num_sentences)
    counts = [Counter(), Counter(), Counter()]
    at = 0
    for length in lengths:
        marked = ["<s>", *(words[i] for i in picks[at : at + length]), "</s>"]
        at += length
        for order in range(3):
            counts[order].update(zip(*(marked[k:] for k in range(order + 1))))
    counts[0].pop(("<s>",), None)
    vocab = [("<s>",), ("</s>",), ("<unk>",), *((w,) for w in words)]
    total = sum(counts[0].values()) + len(vocab)
    contexts = [Counter() for _ in range(3)]
    for order in (1, 2):
        for gram, count in counts[order].items():
            contexts[order][gram[:-1]] += count
    has_backoff = [set(), {g[:-1] for g in counts[1]}, {g[:-1] for g in counts[2]}]
    backoff = f"\t{math.log10(0.5):.6f}"
    lines = ["\\data\\", f"ngram 1={len(vocab)}", f"ngram 2={len(counts[1])}", f"ngram 3={len(counts[2])}"]
    lines += ["", "\\1-grams:"]
    for gram in vocab:
        p = -99.0 if gram == ("<s>",) else math.log10((counts[0][gram] + 1) / total)
        lines.append(f"{p:.6f}\t{gram[0]}" + (backoff if gram in has_backoff[1] else ""))
    for order in (1, 2):
        lines += ["", f"\\{order + 1}-grams:"]
        for gram, count in sorted(counts[order].items()):
            p = math.log10(0.5 * count / contexts[order][gram[:-1]])
            lines.append(f"{p:.6f}\t{' '.join(gram)}" + (backoff if order == 1 and gram in has_backoff[2] else ""))
    path.write_text("\n".join([*lines, "", "\\end\\", ""]), encoding="utf-8")
    return path


def build(arch: str, directory: Path, seed: int = 0) -> int:
    """Saves a randomly initialised transformers Parakeet CTC model of ``arch``'s shape and the bench tokenizer to
    ``directory``; returns the vocabulary size (blank included)."""
    import transformers

    _, encoder, head = CTC_SHAPES[arch]
    torch.manual_seed(seed)
    model = transformers.ParakeetForCTC(transformers.ParakeetCTCConfig(encoder_config=encoder, **head)).eval()
    model.save_pretrained(directory)
    write_tokenizer(directory / "tokenizer.json", head["vocab_size"])
    return head["vocab_size"]


def ctc_log_probs(loaded, audio: list[np.ndarray], batch_size: int) -> list[np.ndarray]:
    """Each clip's CTC log-probs [T, V] as float32 on the host, from the model OASR decodes with."""
    out = []
    with torch.inference_mode():
        for i in range(0, len(audio), batch_size):
            features, lengths = loaded.features(audio[i : i + batch_size], device=loaded.device)
            encoded = loaded.model.encode(features.to(loaded.dtype), lengths)
            lp = loaded.model.ctc_log_probs(encoded.hidden).float().cpu().numpy()
            out.extend(lp[row, :length] for row, length in enumerate(encoded.lengths.tolist()))
    return out


def run_pyctcdecode(tokenizer_file: Path, arpa: Path, log_probs: list[np.ndarray], *, beam_size: int,
                    lm_weight: float, word_bonus: float, workers: int) -> dict:
    try:
        from pyctcdecode import build_ctcdecoder
    except ImportError:
        return {"skipped": "pyctcdecode is not importable (see this module's docstring for the two wheels)"}
    from multiprocessing import get_context

    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_file))
    blank = log_probs[0].shape[-1] - 1
    labels = ["" if i == blank else tok.id_to_token(i) for i in range(blank + 1)]
    labels[0] = "\u2047"  # <unk>, as pyctcdecode writes an unknown piece
    decoder = build_ctcdecoder(labels, kenlm_model_path=str(arpa), alpha=lm_weight, beta=word_bonus)
    # pyctcdecode's pool needs fork (its decoder lives in a module global the children inherit).
    with get_context("fork").Pool(workers) as pool:
        decoder.decode_batch(pool, log_probs[: min(len(log_probs), workers)], beam_width=beam_size)
        start = time.perf_counter()
        texts = decoder.decode_batch(pool, log_probs, beam_width=beam_size)
        seconds = time.perf_counter() - start
    return {"seconds": round(seconds, 3), "workers": workers, "clips": len(log_probs),
            "words_per_clip": round(float(np.mean([len(t.split()) for t in texts])), 2)}


def add_workload_arguments(parser: argparse.ArgumentParser) -> None:
    """The model shape, audio, lexicon and LM of the word-search benches (this one and ``oasr.bench.wfst``)."""
    parser.add_argument("--arch", default="parakeet-ctc-1.1b", choices=sorted(CTC_SHAPES))
    parser.add_argument("--num-utterances", type=int, default=1024)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--num-words", type=int, default=5000, help="lexicon (= LM unigram) size")
    parser.add_argument("--num-sentences", type=int, default=20000, help="sentences the 3-gram LM is counted from")
    parser.add_argument("--max-encode-rows", type=int, default=64)


@dataclass(frozen=True)
class Workload:
    """What ``add_workload_arguments`` asks for, built in a scratch folder: the loaded random model (its
    ``vocab_size``), the audio, the lexicon's words and the 3-gram ARPA file."""

    loaded: Any
    vocab_size: int
    audio: list[np.ndarray]
    words: list[str]
    arpa: Path

    @property
    def audio_seconds(self) -> float:
        return sum(len(a) for a in self.audio) / 16000

    @classmethod
    def build(cls, args: argparse.Namespace, directory: Path) -> Workload:
        from oasr.models.loader import from_pretrained, pick_device, pick_dtype

        device = pick_device(args.device)
        dtype = pick_dtype(None if args.dtype == "auto" else args.dtype, device)
        vocab_size = build(args.arch, directory / "model")
        loaded = from_pretrained(directory / "model", device=device, dtype=dtype)
        words = lexicon_words(vocab_size, args.num_words)
        arpa = write_trigram_arpa(directory / "3gram.arpa", words, num_sentences=args.num_sentences)
        return cls(loaded, vocab_size, synthetic_audio(args.num_utterances), words, arpa)


def bench_scheduler(max_encode_rows: int) -> SchedulerConfig:
    # 20 s of audio is 2001 feature frames: the frame cap never splits a batch of max rows.
    return SchedulerConfig(max_num_seqs=256, max_encode_rows=max_encode_rows,
                           max_encoder_frames=max_encode_rows * 2001)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workload_arguments(parser)
    parser.add_argument("--beam-size", type=int, default=8)
    parser.add_argument("--lm-weight", type=float, default=0.5)
    parser.add_argument("--word-bonus", type=float, default=1.0)
    parser.add_argument("--beam-size-token", type=int, default=None,
                        help="OASR's beam: per frame, only the N likeliest tokens start lexicon moves (default: the "
                             "engine's, 16)")
    parser.add_argument("--beam-threshold", type=float, default=None,
                        help="OASR's beam: drop candidates below the frame's best minus this (default: the engine's, 20)")
    parser.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=True,
                        help="replay decode steps (the word beam's frames among them) as CUDA graphs")
    parser.add_argument("--compile-word-beam", action=argparse.BooleanOptionalAction, default=True,
                        help="torch.compile the word beam's frame before it is captured (CUDA graphs only); the "
                             "warm-up round pays the compilation")
    parser.add_argument("--rounds", type=int, default=2, help="timed runs of each side, alternating; best counts")
    parser.add_argument("--pyctcdecode-clips", type=int, default=256)
    parser.add_argument("--cpu-workers", type=int, default=os.cpu_count() or 1)
    return parser


def main(argv: list[str] | None = None) -> dict:
    from oasr.engine.config import EngineConfig, RunnerConfig
    from oasr.engine.engine import ASREngine
    from oasr.types import DecodeOptions

    args = _parser().parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        work = Workload.build(args, tmp)
        loaded, audio = work.loaded, work.audio
        result = _bench(args, loaded, audio, work.arpa, tmp / "model" / "tokenizer.json",
                        engine_factory=lambda: ASREngine(loaded, EngineConfig(
                            scheduler=bench_scheduler(args.max_encode_rows),
                            runner=RunnerConfig(cuda_graphs=args.cuda_graphs,
                                                compile_word_beam=args.compile_word_beam))),
                        options=DecodeOptions)
    result = {"arch": args.arch, "device": str(loaded.device), "dtype": str(loaded.dtype), "utterances": len(audio),
              "audio_seconds": round(work.audio_seconds, 1), **result}
    print(json.dumps(result))
    return result


def _bench(args, loaded, audio, arpa: Path, tokenizer_file: Path, *, engine_factory, options) -> dict:
    engine = engine_factory()
    greedy = options()
    beam = options(beam_size=args.beam_size, lm=str(arpa), lm_weight=args.lm_weight, word_bonus=args.word_bonus,
                   beam_size_token=args.beam_size_token, beam_threshold=args.beam_threshold)

    def run(opts) -> tuple[float, list]:
        sync(loaded.device)
        start = time.perf_counter()
        out = {o.request_id: o for o in engine.run((f"r{i}", a, opts) for i, a in enumerate(audio))}
        sync(loaded.device)
        seconds = time.perf_counter() - start
        # as it goes, on stderr: a run cut short by its time limit still leaves the timings it took
        label = f"beam {opts.beam_size}" if opts.beam_size else "greedy"
        print(f"{label}: {seconds:.3f} s", file=sys.stderr, flush=True)
        return seconds, [out[f"r{i}"] for i in range(len(audio))]

    # Warm-up of both (kernels, allocator, the LM load and lexicon trie), then alternating timed rounds.
    run(greedy)
    run(beam)
    greedy_times, beam_times = [], []
    for _ in range(args.rounds):
        seconds, greedy_out = run(greedy)
        greedy_times.append(seconds)
        seconds, beam_out = run(beam)
        beam_times.append(seconds)
    # Sanity, untimed: a beam of 1 without an LM is greedy decoding token for token.
    _, beam1_out = run(options(beam_size=1))
    lexicon = set(arpa_unigrams(arpa))
    audio_s = sum(len(a) for a in audio) / 16000
    greedy_s, beam_s = min(greedy_times), min(beam_times)
    log_probs = ctc_log_probs(loaded, audio[: args.pyctcdecode_clips], args.max_encode_rows)
    peer = run_pyctcdecode(tokenizer_file, arpa, log_probs, beam_size=args.beam_size, lm_weight=args.lm_weight,
                           word_bonus=args.word_bonus, workers=args.cpu_workers)
    if "seconds" in peer:
        peer_audio_s = sum(len(a) for a in audio[: len(log_probs)]) / 16000
        peer["audio_seconds_per_second"] = round(peer_audio_s / peer["seconds"], 1)
        peer["oasr_beam_speedup"] = round(audio_s / beam_s / peer["audio_seconds_per_second"], 2)
    beam_words = [loaded.tokenizer.decode(o.token_ids).split() for o in beam_out]
    return {
        "beam_size": args.beam_size, "beam_size_token": args.beam_size_token, "beam_threshold": args.beam_threshold,
        "max_encode_rows": args.max_encode_rows, "cuda_graphs": args.cuda_graphs,
        "compile_word_beam": args.compile_word_beam,
        "lm": {"order": 3, "words": len(lexicon), "bytes": arpa.stat().st_size},
        "greedy": {"seconds": round(greedy_s, 3), "audio_seconds_per_second": round(audio_s / greedy_s, 1),
                   "rounds": [round(t, 3) for t in greedy_times]},
        "beam_lm": {"seconds": round(beam_s, 3), "audio_seconds_per_second": round(audio_s / beam_s, 1),
                    "rounds": [round(t, 3) for t in beam_times],
                    "words_per_clip": round(float(np.mean([len(w) for w in beam_words])), 2)},
        "beam_over_greedy_time": round(beam_s / greedy_s, 2),
        "beam_words_in_lexicon": all(w in lexicon for ws in beam_words for w in ws),
        "beam1_equals_greedy": [o.token_ids for o in beam1_out] == [o.token_ids for o in greedy_out],
        "pyctcdecode": peer,
    }


if __name__ == "__main__":
    main()
