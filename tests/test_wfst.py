"""WFST decoding of CTC log-probs (``oasr.decode.ctc_wfst``) over TLG graphs built here with kaldifst from a
tiny random Parakeet CTC model's tokenizer (one with input epsilons): the strategy's best paths equal kaldi-decoder's FasterDecoder run by
hand over the same graph and log-probs, and an independent exact search (kaldifst's shortest path through the
utterance's log-probs composed with the graph); then the engine, the Python API, the CLI and the refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import oasr
from oasr.cli import main
from oasr.bench.wfst_graph import ctc_topology
from oasr.decode.ctc_wfst import CTCWFST, DecodingGraphCache, collapse_ctc
from oasr.decode.wfst_graph import read_graph_arrays
from oasr.decode.wfst_search import SearchLimits
from oasr.decode.lexicon import DecodingResourceError, Lexicon
from oasr.engine.config import EngineConfig
from oasr.engine.engine import ASREngine
from oasr.errors import UnsupportedOptionError
from oasr.models.capabilities import capabilities_of, check_options
from oasr.models.loader import from_pretrained
from oasr.models.whisper.model import WhisperForConditionalGeneration
from oasr.types import DecodeOptions
from parakeet_reference import build_reference, write_tokenizer
from speech_data import audio_path, clips, manifest_entries

kaldifst = pytest.importorskip("kaldifst")
kaldi_decoder = pytest.importorskip("kaldi_decoder")

CLIP_IDS = ("ps_librivox_0880", "ps_librivox_0890", "ps_librivox_0870")
EXTRA_WORDS = ("the", "cat", "is", "on", "a", "dog")


def word_loop(lexicon: Lexicon):
    """L composed with a unigram G: a loop of words (output label = word index + 1), each spelled token by
    token (labels = token + 1) and costing a different amount, so the graph's scores steer the search."""
    loop = kaldifst.StdVectorFst()
    start = loop.add_state()
    loop.start = start
    loop.set_final(start, 0.0)
    for word, spelling in enumerate(lexicon.spellings):
        state, cost = start, -1.5 + 0.5 * (word % 5)
        for position, token in enumerate(spelling):
            last = position == len(spelling) - 1
            following = start if last else loop.add_state()
            loop.add_arc(state, kaldifst.StdArc(token + 1, word + 1 if position == 0 else 0,
                                                cost if position == 0 else 0.0, following))
            state = following
    return loop


def word_loop_with_epsilons(lexicon: Lexicon):
    """A word loop with input epsilons, as an n-gram G's backoff arcs and word-end arcs put in an HLG: even words
    are entered by an epsilon arc that writes the word, odd words only from a backoff state reached by an
    epsilon arc (and left back to the start by another, a positive epsilon cycle) or from a deeper one, two
    epsilon arcs from the start."""
    loop = kaldifst.StdVectorFst()
    start, backoff, deeper = loop.add_state(), loop.add_state(), loop.add_state()
    loop.start = start
    loop.set_final(start, 0.0)
    loop.add_arc(start, kaldifst.StdArc(0, 0, 0.7, backoff))
    loop.add_arc(backoff, kaldifst.StdArc(0, 0, 0.2, start))
    loop.add_arc(backoff, kaldifst.StdArc(0, 0, 0.3, deeper))
    for word, spelling in enumerate(lexicon.spellings):
        cost = -1.0 + 0.5 * (word % 4)
        if word % 2 == 0:
            state = loop.add_state()
            loop.add_arc(start, kaldifst.StdArc(0, word + 1, cost, state))
            output = 0
        else:
            state, output = (backoff if word % 4 == 1 else deeper), word + 1
        for position, token in enumerate(spelling):
            following = start if position == len(spelling) - 1 else loop.add_state()
            loop.add_arc(state, kaldifst.StdArc(token + 1, output if position == 0 else 0,
                                                cost if output and position == 0 else 0.0, following))
            state = following
    return loop


def write_tlg(path: Path, lexicon: Lexicon, num_columns: int, blank: int, epsilons: bool = False) -> Path:
    topo = ctc_topology(num_columns, blank)
    kaldifst.arcsort(topo, sort_type="olabel")
    lg = (word_loop_with_epsilons if epsilons else word_loop)(lexicon)
    kaldifst.arcsort(lg, sort_type="ilabel")
    tlg = kaldifst.compose(topo, lg)
    kaldifst.arcsort(tlg, sort_type="ilabel")
    tlg.write(str(path))
    return path


def kaldi_decoder_path(graph_path: Path, log_probs: torch.Tensor, blank: int) -> tuple[list[int], list[int], float]:
    """kaldi-decoder's FasterDecoder by hand, with sherpa-onnx's settings: (tokens, words, cost)."""
    graph = kaldifst.StdVectorFst.read(str(graph_path))
    decoder = kaldi_decoder.FasterDecoder(graph, kaldi_decoder.FasterDecoderOptions(beam=16.0, max_active=3000))
    decoder.decode(kaldi_decoder.DecodableCtc(log_probs.numpy()))
    found, lattice = decoder.get_best_path()
    assert found
    _, labels, words, weight = kaldifst.get_linear_symbol_sequence(lattice)
    return collapse_ctc(list(labels), blank), list(words), weight.value1 + weight.value2


def shortest_path(graph_path: Path, log_probs: torch.Tensor, blank: int) -> tuple[list[int], list[int], float]:
    """The exact best path, independent of any beam: the utterance as a chain acceptor (frame t -> t + 1 on every
    column, costing minus its log-prob) composed with the graph, then OpenFst's shortest path."""
    utterance = kaldifst.StdVectorFst()
    for _ in range(log_probs.shape[0] + 1):
        utterance.add_state()
    utterance.start = 0
    utterance.set_final(log_probs.shape[0], 0.0)
    for frame, row in enumerate(log_probs.tolist()):
        for column, log_prob in enumerate(row):
            utterance.add_arc(frame, kaldifst.StdArc(column + 1, column + 1, -log_prob, frame + 1))
    best = kaldifst.shortest_path(kaldifst.compose(utterance, kaldifst.StdVectorFst.read(str(graph_path))))
    found, labels, words, weight = kaldifst.get_linear_symbol_sequence(best)
    assert found
    return collapse_ctc(list(labels), blank), list(words), float(weight.value)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("wfst_parakeet")
    build_reference("ctc").save_pretrained(directory)
    write_tokenizer(directory / "tokenizer.json", "<pad>")
    return directory


@pytest.fixture(scope="module")
def loaded(model_dir: Path):
    return from_pretrained(model_dir, device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def speech():
    return clips(CLIP_IDS)


@pytest.fixture(scope="module")
def lexicon(loaded, speech) -> Lexicon:
    return Lexicon.spelled(sorted({w for c in speech for w in c.text.split()} | set(EXTRA_WORDS)), loaded.tokenizer)


@pytest.fixture(scope="module")
def log_probs(loaded, speech) -> tuple[torch.Tensor, torch.Tensor]:
    features, lengths = loaded.features([c.audio for c in speech])
    with torch.inference_mode():
        encoded = loaded.model.encode(features, lengths)
        return loaded.model.ctc_log_probs(encoded.hidden), encoded.lengths


@pytest.fixture(scope="module")
def graph(tmp_path_factory, loaded, lexicon, log_probs) -> Path:
    return write_tlg(tmp_path_factory.mktemp("wfst") / "TLG.fst", lexicon, log_probs[0].shape[-1],
                     loaded.model.blank_id)


def test_wfst_decoding_equals_kaldi_decoder_and_the_exact_shortest_path(loaded, lexicon, log_probs, graph) -> None:
    lp, lengths = log_probs
    blank = loaded.model.blank_id
    paths = CTCWFST(DecodingGraphCache().get(graph)).paths(lp, lengths, blank)
    for row, path in enumerate(paths):
        frames = lp[row, : lengths[row]].float()
        tokens, words, cost = kaldi_decoder_path(graph, frames, blank)
        assert (path.token_ids, path.word_ids) == (tokens, words)
        assert path.cost == pytest.approx(cost, rel=1e-6)
        exact_tokens, exact_words, exact_cost = shortest_path(graph, frames, blank)
        assert (path.token_ids, path.word_ids) == (exact_tokens, exact_words)
        assert path.cost == pytest.approx(exact_cost, rel=1e-4)
        # The tokens spell the words the graph wrote, as the lexicon spells them.
        assert path.token_ids == [t for w in path.word_ids for t in lexicon.spellings[w - 1]]
    assert sum(len(p.word_ids) for p in paths) >= 3, "the rows decoded (almost) no words: the check could not fail"


@pytest.fixture(scope="module")
def epsilon_graph(tmp_path_factory, loaded, lexicon, log_probs) -> Path:
    return write_tlg(tmp_path_factory.mktemp("wfst") / "TLG_eps.fst", lexicon, log_probs[0].shape[-1],
                     loaded.model.blank_id, epsilons=True)


def random_log_probs(rows: int, columns: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 60, (rows,), generator=generator)
    scores = torch.randn(rows, int(lengths.max()), columns, generator=generator) * 3
    return scores.log_softmax(-1), lengths


@pytest.mark.parametrize("table_entries", [SearchLimits.table_entries, 0], ids=["key table", "sorted keys"])
def test_a_graph_with_epsilon_arcs_decodes_as_kaldi_decoder_and_the_exact_shortest_path(
        loaded, log_probs, epsilon_graph, table_entries) -> None:
    """Epsilon rounds (outputs written on epsilon arcs, a backoff state, an epsilon cycle), on the clips and on
    random frames; recombining through a table of (row, state) keys and by sorting them."""
    graph = DecodingGraphCache().get(epsilon_graph)
    assert not graph.on(torch.device("cpu")).epsilon.empty
    blank = loaded.model.blank_id
    strategy = CTCWFST(graph, SearchLimits(table_entries=table_entries))
    for lp, lengths in (log_probs, random_log_probs(8, log_probs[0].shape[-1], seed=1)):
        for row, path in enumerate(strategy.paths(lp, lengths, blank)):
            frames = lp[row, : lengths[row]].float()
            assert (path.token_ids, path.word_ids) == kaldi_decoder_path(epsilon_graph, frames, blank)[:2]
            exact = shortest_path(epsilon_graph, frames, blank)
            assert (path.token_ids, path.word_ids) == exact[:2]
            assert path.cost == pytest.approx(exact[2], rel=1e-4, abs=1e-3)


def test_a_search_fed_chunk_by_chunk_ends_where_the_whole_utterance_does(loaded, epsilon_graph) -> None:
    """A stream's search: the same rows advanced a few frames at a time, each row ending at its own length."""
    lp, lengths = random_log_probs(6, 33, seed=2)
    strategy = CTCWFST(DecodingGraphCache().get(epsilon_graph))
    whole = strategy.search(6, lp.device)
    whole.advance(lp, lengths)
    chunked = strategy.search(6, lp.device)
    generator = torch.Generator().manual_seed(3)
    done = 0
    while done < lp.shape[1]:
        size = int(torch.randint(1, 9, (1,), generator=generator))
        chunked.advance(lp[:, done : done + size], (lengths - done).clamp(0, size))
        done += size
    expected = whole.best_paths()
    assert chunked.best_paths() == expected
    assert sum(len(p.words) for p in expected) >= 6


def test_a_tight_search_never_beats_the_exact_path(loaded, epsilon_graph) -> None:
    lp, lengths = random_log_probs(6, 33, seed=4)
    blank = loaded.model.blank_id
    graph = DecodingGraphCache().get(epsilon_graph)
    tight = CTCWFST(graph, SearchLimits(beam=1e4, max_active=2, min_active=1)).paths(lp, lengths, blank)
    loose = CTCWFST(graph).paths(lp, lengths, blank)
    for row, (pruned, best) in enumerate(zip(tight, loose)):
        assert best.cost == pytest.approx(shortest_path(epsilon_graph, lp[row, : lengths[row]], blank)[2], abs=1e-3)
        assert pruned.cost >= best.cost - 1e-3
    assert any(p.cost > b.cost + 1e-3 for p, b in zip(tight, loose)), "the limits pruned nothing: no check"


def test_graph_arrays_hold_every_arc_in_order(epsilon_graph) -> None:
    """The const layout read by numpy equals kaldifst's own arc iteration, state by state."""
    fst = kaldifst.StdVectorFst.read(str(epsilon_graph))
    arrays = read_graph_arrays(epsilon_graph)
    num_arcs = sum(fst.num_arcs(state) for state in range(fst.num_states))
    assert (arrays.start, arrays.num_states, arrays.num_arcs) == (fst.start, fst.num_states, num_arcs)
    for state in range(fst.num_states):
        arcs = [(a.ilabel, a.olabel, a.weight.value, a.nextstate) for a in kaldifst.ArcIterator(fst, state)]
        span = range(arrays.offsets[state], arrays.offsets[state + 1])
        assert arcs == [(int(arrays.ilabels[i]), int(arrays.olabels[i]), pytest.approx(float(arrays.weights[i])),
                         int(arrays.next_states[i])) for i in span]
        assert fst.final(state).value == pytest.approx(float(arrays.finals[state]))


def test_a_graph_for_another_vocabulary_is_refused(loaded, speech, epsilon_graph, tmp_path) -> None:
    lp, lengths = random_log_probs(2, 20, seed=5)
    with pytest.raises(DecodingResourceError, match="reads input label 33, but the model writes 20 CTC columns"):
        CTCWFST(DecodingGraphCache().get(epsilon_graph)).paths(lp, lengths, 19)
    wider = tmp_path / "wider.fst"
    ctc_topology(40, loaded.model.blank_id).write(str(wider))  # a CTC topology of 40 columns: labels up to 40
    with pytest.raises(DecodingResourceError, match="reads input label 40, but the model writes 33 CTC columns"):
        oasr.transcribe(speech[0].audio, loaded, decoding_graph=str(wider))


def test_the_engine_and_the_api_decode_over_the_graph_as_the_strategy_does(loaded, speech, lexicon, log_probs,
                                                                           graph) -> None:
    lp, lengths = log_probs
    paths = CTCWFST(DecodingGraphCache().get(graph)).paths(lp, lengths, loaded.model.blank_id)
    results = oasr.transcribe([c.audio for c in speech], loaded, decoding_graph=str(graph), batch_size=3)
    assert [r.token_ids for r in results] == [p.token_ids for p in paths]
    assert [r.text.split() for r in results] == [[lexicon.words[w - 1] for w in p.word_ids] for p in paths]
    greedy = oasr.transcribe([c.audio for c in speech], loaded, batch_size=3)
    assert [r.token_ids for r in greedy] != [p.token_ids for p in paths]


def test_graph_and_greedy_requests_decode_side_by_side(loaded, speech, graph) -> None:
    """One encode batch holds a graph request and a greedy one: each gets what it gets alone."""
    audio = speech[0].audio
    kinds = [DecodeOptions(decoding_graph=str(graph)), DecodeOptions()]
    engine = ASREngine(loaded, EngineConfig())
    alone = [next(iter(engine.run([("a", audio, o)]))).token_ids for o in kinds]
    mixed = {out.request_id: out.token_ids for out in engine.run([(str(i), audio, o) for i, o in enumerate(kinds)])}
    assert [mixed[str(i)] for i in range(2)] == alone
    assert alone[0] != alone[1]


def test_the_cli_decodes_over_a_graph_and_refuses_a_missing_or_bad_one(model_dir, lexicon, graph, tmp_path,
                                                                       capsys) -> None:
    wav = audio_path(next(e for e in manifest_entries() if e["id"] == CLIP_IDS[0]))
    args = ["transcribe", str(wav), "--model", str(model_dir), "--device", "cpu", "--output-format", "jsonl"]
    assert main([*args, "--decoding-graph", str(graph)]) == 0
    text = json.loads(capsys.readouterr().out)["text"]
    assert text and set(text.split()) <= set(lexicon.words)
    assert main([*args, "--decoding-graph", str(tmp_path / "missing.fst")]) == 2
    assert "decoding graph file not found" in capsys.readouterr().err
    bad = tmp_path / "bad.fst"
    bad.write_bytes(b"not an fst")
    assert main([*args, "--decoding-graph", str(bad)]) == 2
    assert "cannot read the decoding graph" in capsys.readouterr().err
    assert main([*args, "--decoding-graph", str(graph), "--beam-size", "4"]) == 2
    assert "does not combine with beam_size" in capsys.readouterr().err


def test_graph_files_are_read_once_and_refused_clearly(graph, tmp_path) -> None:
    cache = DecodingGraphCache()
    assert cache.get(str(graph)) is cache.get(str(graph))
    with pytest.raises(DecodingResourceError, match="not found"):
        read_graph_arrays(tmp_path / "nothing.fst")
    empty = tmp_path / "empty.fst"
    kaldifst.StdVectorFst().write(str(empty))
    with pytest.raises(DecodingResourceError, match="no start state"):
        read_graph_arrays(empty)


def test_a_decoding_graph_is_refused_where_no_strategy_can_use_it() -> None:
    with pytest.raises(ValueError, match="does not combine with beam_size, lm"):
        DecodeOptions(decoding_graph="HLG.fst", beam_size=4, lm="x.arpa")
    with pytest.raises(ValueError, match="empty"):
        DecodeOptions(decoding_graph=" ")
    whisper = capabilities_of(WhisperForConditionalGeneration)
    with pytest.raises(UnsupportedOptionError, match="option decoding_graph "):
        check_options(whisper, DecodeOptions(decoding_graph="HLG.fst"), "whisper")
