"""Hotwords: the automaton's gains, the list syntax, the biased CTC prefix search (a boosted phrase is found on
inputs that hold it and nothing changes on inputs that do not), and the option through the engine, the API, the
CLI and the server's form."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

import oasr
from oasr.cli import main
from oasr.decode.ctc_prefix_beam import prefix_beam_search
from oasr.types import Hotword, HotwordsError, parse_hotwords
from oasr.decode.hotwords import ContextGraph
from oasr.errors import UnsupportedOptionError
from oasr.models.capabilities import capabilities_of, check_options
from oasr.models.loader import from_pretrained
from oasr.models.whisper.model import WhisperForConditionalGeneration
from oasr.serving.serving import inline_hotwords
from oasr.types import DecodeOptions
from parakeet_reference import build_reference, write_tokenizer

JFK = Path(oasr.__file__).parent / "assets" / "jfk.flac"


def test_the_automaton_pays_per_token_takes_back_broken_matches_and_banks_whole_phrases() -> None:
    graph = ContextGraph.build([((3, 4, 5), 2.0), ((4, 6), 1.0)], vocab_size=8)
    state, gains = 0, []
    for token in (3, 4, 7, 3, 4, 5, 4, 6):
        gains.append(float(graph.gain[state, token]))
        state = int(graph.next_state[state, token])
    # 3 4 (+2 +2), 7 breaks the match (-4); 3 4 5 completes (+6, back to the root); 4 6 completes the other (+1 +1)
    assert gains == [2.0, 2.0, -4.0, 2.0, 2.0, 2.0, 1.0, 1.0]
    assert state == 0
    # A broken match falls back along the failure link: "3 4" then 6 completes "4 6" (the suffix 4 is kept).
    after_34 = int(graph.next_state[int(graph.next_state[0, 3]), 4])
    assert float(graph.pending[after_34]) == 4.0
    assert float(graph.gain[after_34, 6]) == pytest.approx(-4.0 + 1.0 + 1.0)
    assert int(graph.next_state[after_34, 6]) == 0


def test_the_host_automaton_tells_the_boost_a_walk_keeps_and_holds_open() -> None:
    """Random phrases and token sequences: the table walk's gains are the host automaton's kept boost (whole
    phrases) plus its open boost (the match still going), and the open boost is the table's pending."""
    rng = random.Random(5)
    for _ in range(50):
        phrases = [(tuple(rng.randrange(6) for _ in range(rng.randint(1, 4))), rng.choice([0.5, 1.0, 2.5]))
                   for _ in range(rng.randint(1, 4))]
        graph = ContextGraph.build(phrases, vocab_size=6)
        tokens = [rng.randrange(6) for _ in range(rng.randint(0, 20))]
        state, total = 0, 0.0
        for token in tokens:
            total += float(graph.gain[state, token])
            state = int(graph.next_state[state, token])
        assert graph.host.open_boost(tokens) == pytest.approx(float(graph.pending[state]))
        assert graph.host.kept_boost(tokens) + graph.host.open_boost(tokens) == pytest.approx(total)
    graph = ContextGraph.build([((3, 4, 5), 2.0), ((4, 6), 1.0)], vocab_size=8)
    assert graph.host.kept_boost((3, 4, 7, 3, 4, 5, 4, 6)) == 8.0  # both phrases whole: 3 x 2 + 2 x 1
    assert (graph.host.kept_boost((5, 3, 4)), graph.host.open_boost((5, 3, 4))) == (0.0, 4.0)


def test_hotword_lists_parse_inline_and_from_a_file(tmp_path) -> None:
    assert parse_hotwords("new york:3, oasr ,  la paz:-0.5") == (
        Hotword("new york", 3.0), Hotword("oasr"), Hotword("la paz", -0.5))
    listed = tmp_path / "hot.txt"
    listed.write_text("kennedy:2.5\n\nask not\n", encoding="utf-8")
    assert parse_hotwords(f"@{listed}") == (Hotword("kennedy", 2.5), Hotword("ask not"))
    for bad, message in (("x:abc", "bad hotword"), (" , ", "no hotword"), ("@/nonexistent/h.txt", "not found"),
                         ("x:1e9", "within")):
        with pytest.raises(HotwordsError, match=message):
            parse_hotwords(bad)


def ambiguous_frames(hold_phrase: bool) -> torch.Tensor:
    """[T, V=6] log-probs, blank 5: the tokens 3 then 4 narrowly beat 1 then 2 (the phrase) where ``hold_phrase``;
    elsewhere 1 and 2 are all but impossible."""
    rows = [[0.05, 0.40, 0.02, 0.45, 0.03, 0.05], [0.01, 0.01, 0.01, 0.01, 0.01, 0.95],
            [0.05, 0.02, 0.40, 0.03, 0.45, 0.05], [0.01, 0.01, 0.01, 0.01, 0.01, 0.95]]
    probs = torch.tensor(rows)
    if not hold_phrase:
        probs[:, 1:3] = 1e-6
    return (probs / probs.sum(-1, keepdim=True)).log()


def test_a_boosted_phrase_is_found_where_it_is_said_and_nothing_changes_elsewhere() -> None:
    holding = [ambiguous_frames(True) + 0.01 * i * torch.randn(4, 6).clamp(-1, 1) for i in range(4)]
    lacking = [ambiguous_frames(False) + 0.01 * i * torch.randn(4, 6).clamp(-1, 1) for i in range(4)]
    log_probs = torch.stack(holding + lacking).log_softmax(-1)
    lengths = torch.full((8,), 4)
    graph = ContextGraph.build([((1, 2), 1.5)], vocab_size=6)
    plain, plain_scores = prefix_beam_search(log_probs, lengths, blank_id=5, beam_size=4)
    biased, biased_scores = prefix_beam_search(log_probs, lengths, blank_id=5, beam_size=4, context=graph)
    def recall(rows):
        return sum(row == [1, 2] for row in rows)
    assert recall(plain[:4]) == 0 and recall(biased[:4]) == 4
    assert biased[4:] == plain[4:] and torch.equal(biased_scores[4:], plain_scores[4:])
    # Half a phrase earns nothing: boosting 1 2 0 (never said whole) leaves every row as it was.
    unfinished = ContextGraph.build([((1, 2, 0), 1.5)], vocab_size=6)
    assert prefix_beam_search(log_probs, lengths, 5, 4, context=unfinished)[0] == plain


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    directory = tmp_path_factory.mktemp("hotwords_parakeet")
    build_reference("ctc").save_pretrained(directory)
    write_tokenizer(directory / "tokenizer.json", "<pad>")
    return from_pretrained(directory, device="cpu", dtype="float32"), directory


def test_the_engine_decodes_hotwords_as_the_biased_search_does(loaded) -> None:
    model, _ = loaded
    audio = oasr.audio.load_audio(JFK)
    pieces = [audio, audio[: 16000 * 4], audio[16000 * 3: 16000 * 9]]
    features, lengths = model.features(pieces)
    with torch.inference_mode():
        encoded = model.model.encode(features, lengths)
        log_probs = model.model.ctc_log_probs(encoded.hidden)
    phrase = "the cat"
    graph = ContextGraph.build([(model.tokenizer.encode(phrase), 4.0)], log_probs.shape[-1])
    expected, _ = prefix_beam_search(log_probs, encoded.lengths, model.model.blank_id, 4, context=graph)
    plain = [r.token_ids for r in oasr.transcribe(pieces, model, beam_size=4, batch_size=3)]
    got = [r.token_ids for r in oasr.transcribe(pieces, model, beam_size=4, batch_size=3, hotwords=f"{phrase}:4")]
    assert got == expected
    assert got != plain, "the boost changed nothing: the comparison could not fail"


def test_hotwords_are_refused_where_no_search_takes_them(loaded, tmp_path, capsys) -> None:
    model, directory = loaded
    with pytest.raises(UnsupportedOptionError, match="give beam_size too"):  # its hotwords steer its search
        oasr.transcribe(JFK, model, hotwords="the")
    whisper = capabilities_of(WhisperForConditionalGeneration)  # its beam search takes them (test_hotwords_aed.py)
    check_options(whisper, DecodeOptions(beam_size=2, hotwords=(Hotword("x"),)), "whisper")
    with pytest.raises(UnsupportedOptionError, match="give beam_size too"):
        check_options(whisper, DecodeOptions(hotwords=(Hotword("x"),)), "whisper")
    lexicon = tmp_path / "words.txt"
    lexicon.write_text("the\ncat\n")
    with pytest.raises(HotwordsError, match="the lexicon has no word 'dog'"):  # the word-level search's words
        oasr.transcribe(JFK, model, beam_size=2, lexicon=str(lexicon), hotwords="the dog")
    args = ["transcribe", str(JFK), "--model", str(directory), "--device", "cpu", "--beam-size", "2"]
    assert main([*args, "--hotwords", "@/nonexistent/hot.txt"]) == 2
    assert "hotwords file not found" in capsys.readouterr().err
    with pytest.raises(ValueError, match="cannot be named"):
        inline_hotwords("@/etc/passwd")
    assert inline_hotwords("the cat:2") == (Hotword("the cat", 2.0),)


def test_hotwords_given_as_a_list_are_kept_as_a_tuple() -> None:
    options = DecodeOptions(beam_size=2, hotwords=[Hotword("the cat")])
    assert options.hotwords == (Hotword("the cat"),) and hash(options)
