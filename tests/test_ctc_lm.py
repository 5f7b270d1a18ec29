"""Word-level CTC beam search (lexicon + n-gram LM) against flashlight-text's LexiconDecoder, the search
torchaudio's ``ctc_decoder`` runs, on log-probs of a tiny random Parakeet CTC model over shared clips; then the
same search through the engine, the Python API and the CLI, and the refusals."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import torch

import oasr
from oasr.cli import main
from oasr.decode.ctc_lexicon_beam import (DEFAULT_BEAM_SIZE_TOKEN, DEFAULT_BEAM_THRESHOLD, LexiconBeamOptions,
                                          LexiconBeamSearch)
from oasr.decode.arpa import ArpaTables
from oasr.decode.lexicon import DecodingResourceError, Lexicon, LexiconTrie, NGramLM, arpa_unigrams
from oasr.decode.word_histories import DeviceHistories, HostHistories, WordHistories
from oasr.engine.config import EngineConfig
from oasr.engine.engine import ASREngine
from oasr.errors import UnsupportedOptionError
from oasr.models.capabilities import capabilities_of, check_options
from oasr.models.loader import from_pretrained
from oasr.models.whisper.model import WhisperForConditionalGeneration
from oasr.decode.word_boosts import WordBoosts
from oasr.types import DecodeOptions, Hotword, HotwordsError
from parakeet_reference import build_reference, write_tokenizer
from random_word_lm import random_lexicon_and_lm, write_bigram_arpa
from speech_data import audio_path, clips, manifest_entries

kenlm = pytest.importorskip("kenlm")
fl = pytest.importorskip("flashlight.lib.text.decoder")

CLIP_IDS = ("ps_librivox_0880", "ps_librivox_0890", "ps_librivox_0870")


def LEXICON_WORDS(speech) -> list[str]:  # noqa: N802 (a constant's spelling: the words every search here knows)
    return sorted({w for c in speech for w in c.text.split()} | {"the", "cat", "is", "on", "a", "dog"})


class KenLMByHistory(fl.LM):
    """flashlight's LM interface over a kenlm model, with a state per word history (as flashlight's own KenLM
    wrapper numbers them); ``path=None`` scores every word 0 (a lexicon without a language model)."""

    def __init__(self, path: Path | None, words: tuple[str, ...]) -> None:
        fl.LM.__init__(self)
        self.model = kenlm.Model(str(path)) if path is not None else None
        self.words = words
        self.states: dict = {}

    def start(self, start_with_nothing: bool):
        state, ken = fl.LMState(), kenlm.State()
        if self.model is not None:
            self.model.BeginSentenceWrite(ken)
        self.states[state] = ken
        return state

    def _next(self, state, index: int, word: str):
        out, ken = state.child(index), kenlm.State()
        score = 0.0 if self.model is None else self.model.BaseScore(self.states[state], word, ken)
        self.states[out] = ken
        return out, score

    def score(self, state, index: int):
        return self._next(state, index, self.words[index])

    def finish(self, state):
        return self._next(state, -1, "</s>")


class BoostedKenLM(KenLMByHistory):
    """The same, with each hotword's boost added as the word is written (``boost / lm_weight``, as flashlight
    weighs what an LM returns): what single-word hotwords are to the word-level search."""

    def __init__(self, path: Path | None, words: tuple[str, ...], boosts: dict[str, float], lm_weight: float) -> None:
        super().__init__(path, words)
        self.boosts, self.lm_weight = boosts, lm_weight

    def score(self, state, index: int):
        out, score = super().score(state, index)
        return out, score + self.boosts.get(self.words[index], 0.0) / self.lm_weight


def flashlight_best(log_probs: torch.Tensor, blank: int, lexicon: Lexicon, lm_path: Path | None,
                    options: LexiconBeamOptions, boosts: dict[str, float] | None = None) -> tuple[list[int], float]:
    """log_probs: [T, V] -> (word ids, score) of flashlight's best hypothesis, pruned as ``options`` say (no
    threshold is flashlight's 1e30, every token its beam_size_token=V)."""
    v = log_probs.shape[-1]
    trie = fl.Trie(v, blank)
    for word, spelling in enumerate(lexicon.spellings):
        trie.insert(list(spelling), word, 0.0)
    trie.smear(fl.SmearingMode.NONE)
    decoder_options = fl.LexiconDecoderOptions(
        beam_size=options.beam_size, beam_size_token=options.beam_size_token or v,
        beam_threshold=min(options.beam_threshold, 1e30), lm_weight=options.lm_weight,
        word_score=options.word_bonus, unk_score=float("-inf"), sil_score=0.0, log_add=True,
        criterion_type=fl.CriterionType.CTC)
    lm = (KenLMByHistory(lm_path, lexicon.words) if boosts is None
          else BoostedKenLM(lm_path, lexicon.words, boosts, options.lm_weight))
    decoder = fl.LexiconDecoder(decoder_options, trie, lm, blank, blank, -1, [], False)
    emissions = log_probs.float().contiguous()
    best = decoder.decode(emissions.data_ptr(), emissions.shape[0], v)[0]
    return [w for w in best.words if w >= 0], best.score


def histories(kind: str, arpa: Path | None, lexicon: Lexicon) -> WordHistories:
    """The search's language-model side: "device" (the ARPA file as tables, or no model) or "host" (KenLM)."""
    if kind == "host" and arpa is not None:
        return HostHistories(NGramLM(arpa), lexicon.words)
    return DeviceHistories(ArpaTables.read(arpa) if arpa is not None else None, lexicon.words, torch.device("cpu"))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("ctc_lm_parakeet")
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
def arpa(tmp_path_factory, speech) -> Path:
    sentences = [c.text.split() for c in speech] + [["the", "cat", "is", "on", "a", "dog"]]
    return write_bigram_arpa(tmp_path_factory.mktemp("lm") / "bigram.arpa", sentences)


@pytest.fixture(scope="module")
def log_probs(loaded, speech) -> tuple[torch.Tensor, torch.Tensor]:
    features, lengths = loaded.features([c.audio for c in speech])
    with torch.inference_mode():
        encoded = loaded.model.encode(features, lengths)
        return loaded.model.ctc_log_probs(encoded.hidden), encoded.lengths


def search_and_flashlight(loaded, speech, arpa, log_probs, with_lm: bool, options: LexiconBeamOptions,
                          kind: str = "device", hotwords: tuple[Hotword, ...] = ()) -> tuple[list[list[int]], list[float]]:
    """Runs the search with ``options`` (and single-word ``hotwords``), asserts flashlight's best equals it on
    every row -> (words, scores)."""
    lexicon = Lexicon.spelled(LEXICON_WORDS(speech), loaded.tokenizer)
    lp, lengths = log_probs
    boosts = WordBoosts.build(hotwords, lexicon, "cpu") if hotwords else None
    search = LexiconBeamSearch(LexiconTrie.build(lexicon, lp.shape[-1]),
                               histories(kind, arpa if with_lm else None, lexicon), loaded.model.blank_id, options,
                               boosts)
    _, got_words, got_scores = search.run(lp, lengths)
    for row in range(len(speech)):
        want_words, want_score = flashlight_best(lp[row, : lengths[row]], loaded.model.blank_id, lexicon,
                                                 arpa if with_lm else None, options,
                                                 {h.phrase: h.boost for h in hotwords} if hotwords else None)
        assert got_words[row] == want_words
        assert got_scores[row] == pytest.approx(want_score, rel=1e-9, abs=1e-6)
    return got_words, got_scores


@pytest.mark.parametrize("kind", ["device", "host"])
@pytest.mark.parametrize("with_lm, beam_size, lm_weight, word_bonus",
                         [(True, 4, 0.5, 0.0), (True, 8, 2.0, 1.5), (False, 8, 0.0, -0.5), (True, 2, 1.0, 3.0)])
def test_lexicon_search_equals_flashlight_on_a_parakeet_ctc_model(loaded, speech, arpa, log_probs, with_lm,
                                                                  beam_size, lm_weight, word_bonus, kind) -> None:
    """Pruned as torchaudio's decoder is by default (every token, threshold 50), so that these random weights leave
    words to compare; the engine's default (NeMo's) pruning is among the next test's cases."""
    options = LexiconBeamOptions(beam_size, lm_weight, word_bonus, beam_size_token=None, beam_threshold=50.0)
    got_words, _ = search_and_flashlight(loaded, speech, arpa, log_probs, with_lm, options, kind)
    assert sum(map(len, got_words)) >= 3, "the rows emitted (almost) no words: the comparison could not fail"


@pytest.mark.parametrize("kind", ["device", "host"])
@pytest.mark.parametrize("with_lm, beam_size, lm_weight, word_bonus, beam_size_token, beam_threshold",
                         [(True, 8, 1.0, 1.5, None, 5.0), (True, 8, 1.0, 1.5, 4, math.inf),
                          (True, 4, 0.5, 0.0, 2, 3.0), (False, 8, 0.0, -0.5, 8, 10.0),
                          (True, 4, -0.5, 2.0, 6, 4.0),  # a negative weight: no bound before the LM
                          (True, 4, 0.5, 0.0, DEFAULT_BEAM_SIZE_TOKEN, DEFAULT_BEAM_THRESHOLD)])
def test_pruning_equals_flashlight_given_the_same_knobs(loaded, speech, arpa, log_probs, with_lm, beam_size,
                                                        lm_weight, word_bonus, beam_size_token,
                                                        beam_threshold, kind) -> None:
    pruned = LexiconBeamOptions(beam_size, lm_weight, word_bonus, beam_size_token=beam_size_token,
                                beam_threshold=beam_threshold)
    _, scores = search_and_flashlight(loaded, speech, arpa, log_probs, with_lm, pruned, kind)
    _, unpruned = search_and_flashlight(loaded, speech, arpa, log_probs, with_lm,
                                        LexiconBeamOptions(beam_size, lm_weight, word_bonus, beam_size_token=None,
                                                           beam_threshold=math.inf),
                                        kind)
    assert scores != unpruned, "these knobs pruned nothing on these clips: the comparison could not fail"


@pytest.mark.parametrize("kind", ["device", "host"])
def test_single_word_hotwords_equal_flashlight_with_their_boost_in_the_language_model(loaded, speech, arpa,
                                                                                     log_probs, kind) -> None:
    """A one-word phrase earns its boost as the word is written and keeps it: flashlight with an LM that adds the
    boost to that word's score is the same search. The boosts change the words found, and write the boosted
    words more often."""
    options = LexiconBeamOptions(8, 1.0, 0.5, beam_size_token=None, beam_threshold=50.0)
    plain, _ = search_and_flashlight(loaded, speech, arpa, log_probs, True, options, kind)
    lexicon = Lexicon.spelled(LEXICON_WORDS(speech), loaded.tokenizer)
    favoured = [w for w in lexicon.words if all(w not in lexicon.words[i] for row in plain for i in row)][:3]
    hotwords = tuple(Hotword(w, 4.0) for w in favoured)
    boosted, _ = search_and_flashlight(loaded, speech, arpa, log_probs, True, options, kind, hotwords)
    count = lambda rows: sum(lexicon.words[i] in favoured for row in rows for i in row)  # noqa: E731
    assert count(boosted) > count(plain) == 0


def test_phrases_of_words_the_lexicon_lacks_are_refused_and_several_spellings_are_one_word(loaded) -> None:
    lexicon = Lexicon(("the", "cat", "cat"), ((1,), (3,), (19, 12, 10)))
    boosts = WordBoosts.build((Hotword("the cat", 2.0),), lexicon, "cpu")
    assert boosts.symbol.tolist() == [0, 1, 1]
    with pytest.raises(HotwordsError, match="the lexicon has no word 'dog'"):
        WordBoosts.build((Hotword("the dog"),), lexicon, "cpu")


def test_random_searches_equal_flashlight_with_and_without_pruning(tmp_path) -> None:
    """Seeded random log-probs, lexicon (distinct spellings of 1-3 tokens) and bigram LM, over random beams,
    weights (a negative LM weight too), pruning knobs and, every other case, two boosted words. Not with both
    weights 0: a word's completion then ties
    with spelling on, and flashlight itself breaks such ties differently from run to run."""
    rng = random.Random(0)
    vocab, blank = 21, 20
    lexicon, arpa = random_lexicon_and_lm(tmp_path, rng, blank)
    pruned_cases = 0
    for case in range(30):
        frames = rng.randint(5, 30)
        torch.manual_seed(case)
        logits = torch.randn(3, frames, vocab) * rng.choice([0.5, 2.0, 4.0])
        logits[..., blank] += rng.choice([0.0, 2.0])
        lp = logits.log_softmax(-1)
        lengths = torch.tensor([frames, max(1, frames - 3), frames])
        options = LexiconBeamOptions(rng.choice([1, 2, 4, 8]), rng.choice([0.5, 2.0, -0.5]),
                                     rng.choice([-1.0, 0.0, 1.5]), beam_size_token=rng.choice([None, 1, 3, 8]),
                                     beam_threshold=rng.choice([math.inf, 50.0, 5.0, 1.0]))
        pruned_cases += options.beam_size_token is not None or options.beam_threshold < 50
        # Every other case boosts two words (single-word hotwords: flashlight's LM adds the boost).
        hot = {w: rng.choice([0.5, 2.0, 6.0]) for w in rng.sample(sorted(set(lexicon.words)), 2)} if case % 2 else {}
        boosts = WordBoosts.build(tuple(Hotword(w, b) for w, b in hot.items()), lexicon, "cpu") if hot else None
        for kind in ("device", "host"):
            search = LexiconBeamSearch(LexiconTrie.build(lexicon, vocab), histories(kind, arpa, lexicon), blank,
                                       options, boosts)
            _, got_words, got_scores = search.run(lp, lengths)
            for row in range(3):
                want_words, want_score = flashlight_best(lp[row, : lengths[row]], blank, lexicon, arpa, options,
                                                         hot or None)
                assert got_words[row] == want_words, (case, row, options, kind)
                assert got_scores[row] == pytest.approx(want_score, rel=1e-9, abs=1e-6), (case, row, options, kind)
    assert pruned_cases >= 15


def test_pruning_knobs_are_checked() -> None:
    with pytest.raises(ValueError, match="beam_size_token must be an integer >= 1"):
        LexiconBeamOptions(beam_size_token=0)
    with pytest.raises(ValueError, match="beam_threshold must be >= 0"):
        LexiconBeamOptions(beam_threshold=float("nan"))


def test_the_engine_and_the_api_decode_with_the_lm_as_the_search_does(loaded, speech, arpa, log_probs) -> None:
    lp, lengths = log_probs
    lexicon = Lexicon.spelled(sorted({w for c in speech for w in c.text.split()} | {"the", "cat", "is", "on", "a",
                                                                                  "dog"}),
                              loaded.tokenizer)
    search = LexiconBeamSearch(LexiconTrie.build(lexicon, lp.shape[-1]), histories("host", arpa, lexicon),
                               loaded.model.blank_id, LexiconBeamOptions(4, 1.0, 0.5))
    tokens, words, _ = search.run(lp, lengths)
    results = oasr.transcribe([c.audio for c in speech], loaded, beam_size=4, lm=str(arpa), lm_weight=1.0,
                              word_bonus=0.5, batch_size=3)
    assert [r.token_ids for r in results] == tokens
    # Every emitted word is one of the ARPA file's (the default lexicon); words the LM names are spelled whole.
    assert [r.text.split() for r in results] == [[lexicon.words[w] for w in row] for row in words]
    greedy = oasr.transcribe([c.audio for c in speech], loaded, batch_size=3)
    assert [r.token_ids for r in greedy] != tokens


def test_hotwords_reach_the_word_level_search_from_the_api_and_the_cli(loaded, model_dir, speech, arpa,
                                                                       log_probs, capsys) -> None:
    lp, lengths = log_probs
    lexicon = Lexicon.spelled(LEXICON_WORDS(speech), loaded.tokenizer)
    options = LexiconBeamOptions(4, 1.0, 0.5, beam_size_token=None, beam_threshold=50.0)
    plain = LexiconBeamSearch(LexiconTrie.build(lexicon, lp.shape[-1]), histories("device", arpa, lexicon),
                              loaded.model.blank_id, options).run(lp, lengths)[0]
    hot = (Hotword("dog", 6.0), Hotword("cat is", 3.0))
    search = LexiconBeamSearch(LexiconTrie.build(lexicon, lp.shape[-1]), histories("device", arpa, lexicon),
                               loaded.model.blank_id, options, WordBoosts.build(hot, lexicon, "cpu"))
    tokens, _, _ = search.run(lp, lengths)
    assert tokens != plain
    kwargs = dict(beam_size=4, lm=str(arpa), lm_weight=1.0, word_bonus=0.5, beam_size_token=100000,
                  beam_threshold=50.0, batch_size=3)
    results = oasr.transcribe([c.audio for c in speech], loaded, hotwords="dog:6,cat is:3", **kwargs)
    assert [r.token_ids for r in results] == tokens
    with pytest.raises(HotwordsError, match="the lexicon has no word 'zebra'"):
        oasr.transcribe([speech[0].audio], loaded, hotwords="zebra", **kwargs)
    wav = audio_path(next(e for e in manifest_entries() if e["id"] == CLIP_IDS[0]))
    args = ["transcribe", str(wav), "--model", str(model_dir), "--device", "cpu", "--output-format", "jsonl",
            "--beam-size", "4", "--lm", str(arpa), "--beam-size-token", "100000", "--beam-threshold", "50"]
    assert main([*args, "--hotwords", "zebra:2"]) == 2
    assert "the lexicon has no word 'zebra'" in capsys.readouterr().err


def test_the_pruning_knobs_reach_the_search_from_the_api_the_engine_and_the_cli(loaded, model_dir, speech, arpa,
                                                                                 log_probs, capsys) -> None:
    lp, lengths = log_probs
    lexicon = Lexicon.spelled(arpa_unigrams(arpa), loaded.tokenizer)  # the default lexicon: the ARPA file's words
    knobs = {"beam_size_token": 2, "beam_threshold": 3.0}
    weights = {"lm_weight": 1.0, "word_bonus": 1.5}

    def searched(**pruning) -> list[list[int]]:
        search = LexiconBeamSearch(LexiconTrie.build(lexicon, lp.shape[-1]), histories("host", arpa, lexicon),
                                   loaded.model.blank_id, LexiconBeamOptions(4, **weights, **pruning))
        return search.run(lp, lengths)[0]

    pruned, unpruned = searched(**knobs), searched()
    assert pruned != unpruned
    audio = [c.audio for c in speech]
    results = oasr.transcribe(audio, loaded, beam_size=4, lm=str(arpa), **weights, **knobs, batch_size=3)
    assert [r.token_ids for r in results] == pruned
    # One engine batch holds pruned and unpruned requests: each group gets its own search.
    options = [DecodeOptions(beam_size=4, lm=str(arpa), **weights, **knobs), DecodeOptions(beam_size=4, lm=str(arpa),
                                                                                          **weights)]
    requests = [(f"{kind}-{row}", audio[row], o) for kind, o in enumerate(options) for row in range(len(audio))]
    mixed = {out.request_id: out.token_ids for out in ASREngine(loaded, EngineConfig()).run(requests)}
    assert [mixed[f"0-{row}"] for row in range(len(audio))] == pruned
    assert [mixed[f"1-{row}"] for row in range(len(audio))] == unpruned
    wav = audio_path(next(e for e in manifest_entries() if e["id"] == CLIP_IDS[0]))
    assert main(["transcribe", str(wav), "--model", str(model_dir), "--device", "cpu", "--output-format", "jsonl",
                 "--beam-size", "4", "--lm", str(arpa), "--lm-weight", "1.0", "--word-bonus", "1.5",
                 "--beam-size-token", "2", "--beam-threshold", "3"]) == 0
    assert json.loads(capsys.readouterr().out)["text"] == results[0].text


def test_requests_with_and_without_the_lm_decode_side_by_side(loaded, speech, arpa) -> None:
    """One encode batch holds a word-level request, a plain beam and a greedy one: each gets what it gets alone."""
    audio = [c.audio for c in speech]
    kinds = [DecodeOptions(beam_size=4, lm=str(arpa)), DecodeOptions(beam_size=4), DecodeOptions()]
    engine = ASREngine(loaded, EngineConfig())
    alone = [next(iter(engine.run([("a", audio[0], o)]))).token_ids for o in kinds]
    mixed = {out.request_id: out.token_ids for out in engine.run([(str(i), audio[0], o) for i, o in enumerate(kinds)])}
    assert [mixed[str(i)] for i in range(3)] == alone
    assert alone[0] != alone[1]


def test_the_cli_decodes_with_a_language_model_and_refuses_a_missing_one(model_dir, speech, arpa, tmp_path,
                                                                        capsys) -> None:
    wav = audio_path(next(e for e in manifest_entries() if e["id"] == CLIP_IDS[0]))
    args = ["transcribe", str(wav), "--model", str(model_dir), "--device", "cpu", "--output-format", "jsonl",
            "--beam-size", "4", "--lm-weight", "1.0", "--word-bonus", "0.5",
            # torchaudio's pruning (every token, 50): the engine's own (NeMo's) leaves this random model few words
            "--beam-size-token", "100000", "--beam-threshold", "50"]
    assert main([*args, "--lm", str(arpa)]) == 0
    text = json.loads(capsys.readouterr().out)["text"]
    assert text and set(text.split()) <= set(Path(arpa).read_text().split())
    assert main([*args, "--lm", str(tmp_path / "missing.arpa")]) == 2
    assert "language model file not found" in capsys.readouterr().err


def test_a_binary_lm_needs_a_lexicon_and_a_lexicon_alone_steers_the_search(loaded, speech, tmp_path) -> None:
    fake_binary = tmp_path / "lm.bin"
    fake_binary.write_bytes(b"not a kenlm file")
    with pytest.raises(DecodingResourceError, match="cannot read the language model"):
        oasr.transcribe(speech[0].audio, loaded, beam_size=2, lm=str(fake_binary))
    lexicon = tmp_path / "words.txt"
    lexicon.write_text("the\ncat\ndog\n", encoding="utf-8")
    text = oasr.transcribe(speech[0].audio, loaded, beam_size=2, lexicon=str(lexicon), word_bonus=2.0)[0].text
    assert text and set(text.split()) <= {"the", "cat", "dog"}


def test_lm_options_are_refused_where_no_search_can_use_them() -> None:
    with pytest.raises(ValueError, match="give beam_size too"):
        DecodeOptions(lm="x.arpa")
    with pytest.raises(ValueError, match="give lm or lexicon too"):
        DecodeOptions(beam_size=4, lm_weight=0.3)
    with pytest.raises(ValueError, match="prune the word-level search: give lm or lexicon too"):
        DecodeOptions(beam_size=4, beam_threshold=10.0)
    with pytest.raises(ValueError, match="beam_size_token must be an integer >= 1"):
        DecodeOptions(beam_size=4, lm="x.arpa", beam_size_token=0)
    whisper = capabilities_of(WhisperForConditionalGeneration)  # searches, but has no word-level search
    check_options(whisper, DecodeOptions(beam_size=4), "whisper")
    with pytest.raises(UnsupportedOptionError, match="option lm "):
        check_options(whisper, DecodeOptions(beam_size=4, lm="x.arpa"), "whisper")
    with pytest.raises(UnsupportedOptionError, match="option lexicon "):
        check_options(whisper, DecodeOptions(beam_size=4, lexicon="w.txt", beam_size_token=8, beam_threshold=5.0),
                      "whisper")
