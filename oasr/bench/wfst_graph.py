"""A TLG decoding graph for the WFST bench, built with kaldifst the way icefall builds its HLG: the CTC topology T,
the lexicon L (each word spelled by the model's tokens, the word written on its first token), and the grammar G
(an ARPA n-gram model: a state per history, an arc per n-gram, an epsilon arc per back-off). L and G are composed
with the back-off arcs marked by a disambiguation symbol ``#0``, determinized (so a history's words that start with
the same token share their first arc), the ``#0`` labels turned into epsilons, and composed with T.

The bench's lexicon writes each word with one word-start piece and continuation pieces, so a token sequence has
one segmentation into words and L needs no disambiguation of homophones or prefixes.
"""

from __future__ import annotations

import math
from pathlib import Path

from oasr.decode.arpa import BOS, EOS, read_sections

_LN10 = math.log(10.0)


def ctc_topology(num_columns: int, blank: int):
    """k2's standard CTC topology, labels = column + 1: state 0 after a blank (the start), state ``c + 1`` after
    column ``c``; a column's first frame writes it, its repeats and blanks write nothing. Every state is final."""
    import kaldifst

    topo = kaldifst.StdVectorFst()
    for _ in range(num_columns + 1):
        topo.set_final(topo.add_state(), 0.0)
    topo.start = 0
    for state in range(num_columns + 1):
        topo.add_arc(state, kaldifst.StdArc(blank + 1, 0, 0.0, 0))
        for column in range(num_columns):
            if column != blank:
                label = column + 1
                topo.add_arc(state, kaldifst.StdArc(label, 0 if state == label else label, 0.0, label))
    return topo


def lexicon_fst(spellings: list[list[int]], disambig_token: int, disambig_word: int):
    """A loop of words (output label = word index + 1) spelled token by token (input label = token + 1), with a
    ``#0`` self-loop at the start that lets G's back-off marks through."""
    import kaldifst

    lexicon = kaldifst.StdVectorFst()
    start = lexicon.add_state()
    lexicon.start = start
    lexicon.set_final(start, 0.0)
    lexicon.add_arc(start, kaldifst.StdArc(disambig_token, disambig_word, 0.0, start))
    for word, spelling in enumerate(spellings):
        state = start
        for position, token in enumerate(spelling):
            following = start if position == len(spelling) - 1 else lexicon.add_state()
            lexicon.add_arc(state, kaldifst.StdArc(token + 1, word + 1 if position == 0 else 0, 0.0, following))
            state = following
    return lexicon


def grammar_fst(arpa: Path, word_ids: dict[str, int], disambig_word: int):
    """The ARPA model as an acceptor over word ids: a state per history (the n-grams below the top order), the
    start at ``<s>``; an n-gram's arc leads to the longest history its words end in; a history backs off to the
    one without its first word through a ``#0`` arc; ``</s>`` is a history's final weight. Weights are costs
    (minus natural-log probabilities)."""
    import kaldifst

    sections = read_sections(arpa)
    order = len(sections)
    histories = {(): None}
    for grams in sections[:-1]:
        histories.update((gram, None) for gram in grams if gram[-1] != EOS)
    grammar = kaldifst.StdVectorFst()
    state = {history: grammar.add_state() for history in histories}
    grammar.start = state[(BOS,)]

    def landing(words: tuple[str, ...]) -> int:
        words = words[-(order - 1) :] if order > 1 else ()
        while words not in state:
            words = words[1:]
        return state[words]

    for grams in sections:
        for gram, (log10_prob, backoff) in grams.items():
            if gram in state:
                grammar.add_arc(state[gram], kaldifst.StdArc(disambig_word, disambig_word, -backoff * _LN10,
                                                             state[gram[1:]]))
            history, word = gram[:-1], gram[-1]
            if history not in state or word == BOS:
                continue
            cost = -log10_prob * _LN10
            if word == EOS:
                grammar.set_final(state[history], cost)
            elif word in word_ids:
                label = word_ids[word]
                grammar.add_arc(state[history], kaldifst.StdArc(label, label, cost, landing(gram)))
    return grammar


def build_tlg(words: list[str], spellings: list[list[int]], arpa: Path, num_columns: int, blank: int):
    """T o det(L o G) with the back-off marks as epsilons; words[i] (spelled by spellings[i]) is output label
    i + 1."""
    import kaldifst

    disambig_token, disambig_word = num_columns + 1, len(words) + 1  # past every real label
    lexicon = lexicon_fst(spellings, disambig_token, disambig_word)
    kaldifst.arcsort(lexicon, sort_type="olabel")
    grammar = grammar_fst(arpa, {w: i + 1 for i, w in enumerate(words)}, disambig_word)
    kaldifst.arcsort(grammar, sort_type="ilabel")
    lg = _relabel(kaldifst.determinize(kaldifst.compose(lexicon, grammar)), disambig_token, disambig_word)
    kaldifst.arcsort(lg, sort_type="ilabel")
    topo = ctc_topology(num_columns, blank)
    kaldifst.arcsort(topo, sort_type="olabel")
    tlg = kaldifst.compose(topo, lg)
    kaldifst.arcsort(tlg, sort_type="ilabel")
    return tlg


def _relabel(fst, token_label: int, word_label: int):
    """A copy of ``fst`` with input ``token_label`` and output ``word_label`` replaced by epsilon."""
    import kaldifst

    out = kaldifst.StdVectorFst()
    for _ in range(fst.num_states):
        out.add_state()
    out.start = fst.start
    for state in range(fst.num_states):
        final = fst.final(state).value
        if math.isfinite(final):
            out.set_final(state, final)
        for arc in kaldifst.ArcIterator(fst, state):
            out.add_arc(state, kaldifst.StdArc(0 if arc.ilabel == token_label else arc.ilabel,
                                               0 if arc.olabel == word_label else arc.olabel,
                                               arc.weight.value, arc.nextstate))
    return out
