"""The word-level beam's frames replayed as CUDA graphs equal the same frames run eagerly: buffers reused and reset
across searches, ragged lengths, graphs shared by searches with other weights, eviction. Needs neither KenLM nor
flashlight (the LM is an ARPA file the search reads into device tables), so the GPU test runs wherever CUDA is."""

from __future__ import annotations

import logging
import random
from pathlib import Path

import pytest
import torch

from oasr.decode.arpa import ArpaTables
from oasr.decode.ctc_lexicon_beam import LexiconBeamOptions, LexiconBeamSearch
from oasr.decode.ctc_lexicon_graphs import LexiconFrameGraphs
from oasr.decode.lexicon import LexiconTrie
from oasr.decode.word_histories import DeviceHistories
from random_word_lm import random_lexicon_and_lm


def churn_allocator(device: torch.device) -> None:
    """Hands the caching allocator's free blocks to new tensors full of a huge index: a captured graph that reads
    memory nobody holds any more then reads these values (the index kernels assert on them)."""
    if device.type == "cuda":  # held all at once, so each takes a block of its own: 8 bytes to 256 KiB
        _ = [torch.full((n,), 2**40, dtype=torch.long, device=device) for n in (*range(1, 2048), 4096, 32768)]


def frame_graphs_equal_eager(device: torch.device, tmp_path: Path, *, compile_frames: bool = False,
                             num_cases: int = 6) -> None:
    """One LexiconFrameGraphs object over searches of several batch sizes (sharing buckets, so its buffers are
    reused and reset) and lengths (not multiples of its window): every result equals the eager frames', also when
    the allocator has handed out freed memory between a graph's capture and its replays, and with the frames
    compiled (``compile_frames``)."""
    rng = random.Random(1)
    vocab, blank = 21, 20
    lexicon, arpa = random_lexicon_and_lm(tmp_path, rng, blank)
    graphs = LexiconFrameGraphs(frames_per_graph=4, max_graphs=3, compile_frames=compile_frames)
    sides = {True: DeviceHistories(ArpaTables.read(arpa).to(device), lexicon.words, device),
             False: DeviceHistories(None, lexicon.words, device)}
    trie = LexiconTrie.build(lexicon, vocab, device)
    words_seen = 0
    # (rows, beam, token beam, with the LM, LM weight, word bonus, threshold): cases 0 and 1 differ only in the LM
    # side, 3 reuses 2's graph with other weights, 4 needs a bucket of 16 rows; five graphs in all, over a cap of
    # three.
    cases = [(3, 2, None, True, 1.0, 0.5, 50.0), (5, 2, None, False, 1.0, 0.5, 50.0), (8, 4, 4, True, 1.0, 0.5, 50.0),
             (2, 4, 4, True, 3.0, -1.0, 4.0), (9, 2, None, True, 1.0, 0.5, 50.0), (3, 4, None, False, 0.5, 1.5, 8.0)]
    for case, (rows, beam, token_beam, with_lm, lm_weight, word_bonus, threshold) in enumerate(cases[:num_cases]):
        frames = rng.randint(3, 23)
        torch.manual_seed(case)
        logits = torch.randn(rows, frames, vocab) * 3.0
        lp = logits.log_softmax(-1).to(device)
        lengths = torch.tensor([frames] + [rng.randint(1, frames) for _ in range(rows - 1)], device=device)
        options = LexiconBeamOptions(beam, lm_weight, word_bonus, beam_size_token=token_beam, beam_threshold=threshold)
        search = LexiconBeamSearch(trie, sides[with_lm], blank, options)
        eager = search.run(lp, lengths)
        assert search.run(lp, lengths, graphs) == eager, (case, rows, frames)
        churn_allocator(device)
        assert search.run(lp, lengths, graphs) == eager, ("replayed after the allocator moved on", case)
        if case == 3:  # the graph case 2 captured, read with case 3's weights: they change this result
            case_2 = LexiconBeamOptions(4, 1.0, 0.5, beam_size_token=4, beam_threshold=50.0)
            assert LexiconBeamSearch(trie, sides[with_lm], blank, case_2).run(lp, lengths) != eager
        words_seen += sum(map(len, eager[1]))
    assert words_seen > 20, "no words: the comparison could not fail"
    assert len(graphs._graphs) == min(3, num_cases)  # more keys than that were met (rows buckets, options): the oldest went


def test_frame_graphs_equal_the_eager_frames(tmp_path) -> None:
    frame_graphs_equal_eager(torch.device("cpu"), tmp_path)


@pytest.mark.gpu
def test_frame_graphs_equal_the_eager_frames_on_cuda(tmp_path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    frame_graphs_equal_eager(torch.device("cuda"), tmp_path)


def test_compiled_frames_equal_the_eager_frames(tmp_path) -> None:
    """The frame through torch.compile (on the CPU: one shape, so one compilation, with and without the LM) gives
    the eager frames' result."""
    frame_graphs_equal_eager(torch.device("cpu"), tmp_path, compile_frames=True, num_cases=2)


@pytest.mark.gpu
def test_compiled_frame_graphs_equal_the_eager_frames_on_cuda(tmp_path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    frame_graphs_equal_eager(torch.device("cuda"), tmp_path, compile_frames=True)


def test_a_frame_that_cannot_be_compiled_runs_eagerly(tmp_path, caplog) -> None:
    """A compilation that fails (here: a compiled frame that raises) leaves the search to eager frames, with a
    warning; the search's result is the eager one and later captures do not try again."""
    rng = random.Random(3)
    lexicon, arpa = random_lexicon_and_lm(tmp_path, rng, 20)
    device = torch.device("cpu")
    search = LexiconBeamSearch(LexiconTrie.build(lexicon, 21, device),
                               DeviceHistories(ArpaTables.read(arpa).to(device), lexicon.words, device), 20,
                               LexiconBeamOptions(4, 1.0, 0.5, beam_size_token=None, beam_threshold=50.0))
    torch.manual_seed(0)
    lp = (torch.randn(3, 9, 21) * 3.0).log_softmax(-1)
    lengths = torch.tensor([9, 5, 7])
    graphs = LexiconFrameGraphs(frames_per_graph=4, compile_frames=True)

    def broken(*args):
        raise RuntimeError("no compiler here")

    graphs._advance = broken
    with caplog.at_level(logging.WARNING, logger="oasr.decode.ctc_lexicon_graphs"):
        assert search.run(lp, lengths, graphs) == search.run(lp, lengths)
    assert "could not be compiled" in caplog.text
    assert graphs._advance is not broken
