"""WFST decoding at Parakeet CTC shapes (random weights) over a TLG built from a 3-gram LM and a lexicon
(``oasr.bench.wfst_graph``): OASR's search on the device (``oasr.decode.ctc_wfst``) against OASR's greedy decoding
in the same run, and against kaldi-decoder's ``FasterDecoder`` on the CPU (the search sherpa-onnx runs) over the
same graph and log-probs, whose best paths it must also match.

H200 (one command; prints one JSON line; kaldifst and kaldi-decoder are needed: the ``wfst`` and ``test`` extras)::

    python -m oasr.bench.wfst --arch parakeet-ctc-1.1b --num-utterances 1024 --device cuda

The model, tokenizer, lexicon and 3-gram file are those of ``oasr.bench.ctc_lm`` (5,000 words of 1-3 tokens, an LM
counted from 20,000 Zipf sentences); the graph is built here in seconds. Random weights give flat CTC posteriors,
under which every search keeps the most tokens it may; ``--ctc-logit-scale`` sharpens them towards a trained
model's. Timed: whole-engine runs (features, encoder, search) of greedy and graph requests, alternating,
``--rounds`` each after one warm-up, best counts; then the search alone, on the device, over the log-probs of
``--kaldi-clips`` clips, and kaldi-decoder over the same log-probs in a pool of ``--cpu-workers`` processes (one row
at a time each, as it decodes); throughput is audio seconds per second. ``paths_equal_kaldi`` is the fraction of
those clips whose words and tokens equal kaldi-decoder's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from oasr.bench import ctc_lm
from oasr.bench.parakeet import sync
from oasr.bench.wfst_graph import build_tlg

_KALDI: dict = {}  # the worker processes' graph, read once per process (fork start)


def _kaldi_init(graph_path: str) -> None:
    import kaldifst

    _KALDI["graph"] = kaldifst.StdVectorFst.read(graph_path)


def _kaldi_row(log_probs: np.ndarray) -> tuple[list[int], list[int]]:
    import kaldi_decoder
    import kaldifst

    decoder = kaldi_decoder.FasterDecoder(_KALDI["graph"], kaldi_decoder.FasterDecoderOptions(beam=16.0,
                                                                                              max_active=3000))
    decoder.decode(kaldi_decoder.DecodableCtc(log_probs))
    found, lattice = decoder.get_best_path()
    if not found:
        return [], []
    _, labels, words, _ = kaldifst.get_linear_symbol_sequence(lattice)
    return list(labels), list(words)


def run_kaldi(graph_path: Path, log_probs: list[np.ndarray], workers: int) -> tuple[float, list]:
    from multiprocessing import get_context

    with get_context("fork").Pool(workers, _kaldi_init, (str(graph_path),)) as pool:
        pool.map(_kaldi_row, log_probs[:workers])  # warm: each worker has read the graph
        start = time.perf_counter()
        paths = pool.map(_kaldi_row, log_probs, chunksize=1)
        return time.perf_counter() - start, paths


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ctc_lm.add_workload_arguments(parser)
    parser.add_argument("--rounds", type=int, default=2, help="timed runs of each side, alternating; best counts")
    parser.add_argument("--kaldi-clips", type=int, default=256)
    parser.add_argument("--ctc-logit-scale", type=float, default=6.0,
                        help="multiplies the random CTC head's weights: random weights give flat posteriors (the "
                        "top token's mean log-prob about -3 at 1), where a trained model's are peaked (near 0); "
                        "the JSON reports the mean the scale gave")
    parser.add_argument("--cpu-workers", type=int, default=os.cpu_count() or 1)
    return parser


def main(argv: list[str] | None = None) -> dict:
    from oasr.decode.ctc_wfst import CTCWFST, DecodingGraphCache, collapse_ctc
    from oasr.engine.config import EngineConfig
    from oasr.engine.engine import ASREngine
    from oasr.types import DecodeOptions

    args = _parser().parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        work = ctc_lm.Workload.build(args, tmp)
        loaded, audio, words, vocab_size = work.loaded, work.audio, work.words, work.vocab_size
        with torch.no_grad():
            loaded.model.ctc_head.weight.mul_(args.ctc_logit_scale)
            loaded.model.ctc_head.bias.mul_(args.ctc_logit_scale)
        start = time.perf_counter()
        tlg = build_tlg(words, [loaded.tokenizer.encode(w) for w in words], work.arpa, vocab_size,
                        loaded.model.blank_id)
        graph_path = tmp / "TLG.fst"
        tlg.write(str(graph_path))
        graph = {"states": tlg.num_states, "arcs": sum(tlg.num_arcs(s) for s in range(tlg.num_states)),
                 "build_seconds": round(time.perf_counter() - start, 1)}
        engine = ASREngine(loaded, EngineConfig(scheduler=ctc_lm.bench_scheduler(args.max_encode_rows)))

        def run(options: DecodeOptions, label: str) -> tuple[float, list]:
            sync(loaded.device)
            begin = time.perf_counter()
            out = {o.request_id: o for o in engine.run((f"r{i}", a, options) for i, a in enumerate(audio))}
            sync(loaded.device)
            seconds = time.perf_counter() - begin
            print(f"{label}: {seconds:.3f} s", file=sys.stderr, flush=True)
            return seconds, [out[f"r{i}"] for i in range(len(audio))]

        greedy, graph_options = DecodeOptions(), DecodeOptions(decoding_graph=str(graph_path))
        start = time.perf_counter()
        run(greedy, "greedy (warm-up)")
        run(graph_options, "graph (warm-up, reads the graph)")
        warm_up_s = time.perf_counter() - start
        greedy_times, graph_times = [], []
        for _ in range(args.rounds):
            greedy_times.append(run(greedy, "greedy")[0])
            seconds, graph_out = run(graph_options, "graph")
            graph_times.append(seconds)

        # The search alone over fixed log-probs, then kaldi-decoder over the same ones.
        log_probs = ctc_lm.ctc_log_probs(loaded, audio[: args.kaldi_clips], args.max_encode_rows)
        clips_s = sum(len(a) for a in audio[: len(log_probs)]) / 16000
        strategy = CTCWFST(DecodingGraphCache().get(graph_path))
        blank = loaded.model.blank_id
        ours, search_s = [], 0.0
        for at in range(0, len(log_probs), args.max_encode_rows):
            part = log_probs[at : at + args.max_encode_rows]
            lengths = torch.tensor([len(p) for p in part])
            padded = torch.zeros(len(part), int(lengths.max()), vocab_size)
            for row, p in enumerate(part):
                padded[row, : len(p)] = torch.from_numpy(p)
            padded = padded.to(loaded.device)
            sync(loaded.device)
            begin = time.perf_counter()
            ours.extend(strategy.paths(padded, lengths, blank))
            sync(loaded.device)
            search_s += time.perf_counter() - begin
        kaldi_s, kaldi_paths = run_kaldi(graph_path, log_probs, args.cpu_workers)
        equal = [(p.token_ids, p.word_ids) == (collapse_ctc(labels, blank), kw)
                 for p, (labels, kw) in zip(ours, kaldi_paths)]
    greedy_s, graph_s = min(greedy_times), min(graph_times)
    audio_s = work.audio_seconds
    result = {
        "arch": args.arch, "device": str(loaded.device), "dtype": str(loaded.dtype), "utterances": len(audio),
        "audio_seconds": round(audio_s, 1), "max_encode_rows": args.max_encode_rows, "graph": graph,
        "greedy": {"seconds": round(greedy_s, 3), "audio_seconds_per_second": round(audio_s / greedy_s, 1),
                   "rounds": [round(t, 3) for t in greedy_times]},
        "graph_decode": {"seconds": round(graph_s, 3), "audio_seconds_per_second": round(audio_s / graph_s, 1),
                         "rounds": [round(t, 3) for t in graph_times], "warm_up_seconds": round(warm_up_s, 1),
                         "tokens_per_clip": round(float(np.mean([len(o.token_ids) for o in graph_out])), 2)},
        "graph_over_greedy_time": round(graph_s / greedy_s, 2),
        "ctc_logit_scale": args.ctc_logit_scale,
        "top_token_mean_log_prob": round(float(np.mean([p.max(-1).mean() for p in log_probs])), 3),
        "search_only": {"clips": len(log_probs), "seconds": round(search_s, 3),
                        "audio_seconds_per_second": round(clips_s / search_s, 1)},
        "kaldi_decoder": {"clips": len(log_probs), "workers": args.cpu_workers, "seconds": round(kaldi_s, 3),
                          "audio_seconds_per_second": round(clips_s / kaldi_s, 1)},
        "search_over_kaldi_speed": round(kaldi_s / search_s, 2),
        "paths_equal_kaldi": round(sum(equal) / max(len(equal), 1), 4),
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
