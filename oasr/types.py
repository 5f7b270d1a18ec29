"""Public result and option types of the Python API."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from oasr.errors import OASRError

Task = Literal["transcribe", "translate"]
LongForm = Literal["parallel", "sequential"]
LONG_FORM_MODES = ("parallel", "sequential")


# Hotwords (context biasing) as requests carry them; ``oasr.decode.hotwords`` compiles them for a search.
# Per token of a phrase, in natural-log units of the acoustic score (sherpa-onnx's default hotwords score).
DEFAULT_HOTWORD_BOOST = 1.5
# The beam a server searches a request's hotwords with where its protocol has no beam_size of its own (a realtime
# session, Riva's speech contexts) and the model's hotwords steer a search (``hotwords_need_beam``).
SERVER_HOTWORD_BEAM_SIZE = 4


class HotwordsError(OASRError):
    """A hotword list that cannot be read or parsed."""


@dataclass(frozen=True)
class Hotword:
    phrase: str
    boost: float = DEFAULT_HOTWORD_BOOST  # added per token of the phrase

    def __post_init__(self) -> None:
        if not self.phrase.strip():
            raise ValueError("a hotword phrase is empty")
        if not self.boost == self.boost or abs(self.boost) > 100:  # NaN, or a value no score scale explains
            raise ValueError(f"hotword boost must be a number within [-100, 100], got {self.boost}")


def parse_hotwords(spec: str) -> tuple[Hotword, ...]:
    """``"phrase[:boost],..."`` or ``"@FILE"`` (one ``phrase[:boost]`` a line) -> the hotwords."""
    if spec.startswith("@"):
        path = Path(spec[1:])
        if not path.is_file():
            raise HotwordsError(f"hotwords file not found: {path}")
        items = path.read_text(encoding="utf-8").splitlines()
    else:
        items = spec.split(",")
    hotwords = []
    for item in (i.strip() for i in items):
        if not item:
            continue
        phrase, sep, boost = item.rpartition(":")
        if not sep:
            phrase, boost = item, ""
        try:
            hotwords.append(Hotword(phrase.strip(), float(boost) if boost.strip() else DEFAULT_HOTWORD_BOOST))
        except ValueError as e:
            raise HotwordsError(f"bad hotword {item!r}: {e}") from None
    if not hotwords:
        raise HotwordsError(f"no hotword in {spec!r}")
    return tuple(hotwords)


def check_beam_options(beam_size: int | None, patience: float | None, length_penalty: float | None) -> None:
    """openai-whisper's rules for beam-search options (``DecodingTask._verify_options``, ``BeamSearchDecoder``),
    with messages that say which value is wrong. OASR has no best-of-N sampling, so ``length_penalty`` (which
    ranks hypotheses) needs a beam as ``patience`` does, rather than being accepted and ignored."""
    if beam_size is None:
        if patience is not None or length_penalty is not None:
            raise ValueError("patience and length_penalty shape beam search: give beam_size too")
        return
    if isinstance(beam_size, bool) or not isinstance(beam_size, int) or beam_size < 1:
        raise ValueError(f"beam_size must be an integer >= 1 (or None for greedy decoding), got {beam_size!r}")
    if patience is not None and not patience > 0:
        raise ValueError(f"patience must be > 0, got {patience}")
    if round(beam_size * (patience or 1.0)) < 1:
        raise ValueError(f"beam_size {beam_size} with patience {patience} waits for no finished hypothesis")
    if length_penalty is not None and not 0.0 <= length_penalty <= 1.0:
        raise ValueError(f"length_penalty must be in [0, 1] (or None: divide by the length), got {length_penalty}")


def check_lm_options(beam_size: int | None, lm: str | None, lexicon: str | None, lm_weight: float | None,
                     word_bonus: float | None, beam_size_token: int | None = None,
                     beam_threshold: float | None = None) -> None:
    """A language model or lexicon steers a beam search: it needs ``beam_size``; the weights and the word-level
    search's pruning knobs need a language model or lexicon. Whether hotwords need ``beam_size`` depends on the
    model (its capability record: ``hotwords_need_beam``), so the engine's option check decides that."""
    if (lm is not None or lexicon is not None) and beam_size is None:
        raise ValueError("lm and lexicon steer beam search: give beam_size too")
    if (lm_weight is not None or word_bonus is not None) and lm is None and lexicon is None:
        raise ValueError("lm_weight and word_bonus weigh a language model or lexicon: give lm or lexicon too")
    if (beam_size_token is not None or beam_threshold is not None) and lm is None and lexicon is None:
        raise ValueError("beam_size_token and beam_threshold prune the word-level search: give lm or lexicon too")
    check_pruning(beam_size_token, beam_threshold)


def check_pruning(beam_size_token: int | None, beam_threshold: float | None) -> None:
    """The word-level search's pruning knobs (flashlight's beamSizeToken and beamThreshold). On a request
    (DecodeOptions) None takes the default; on LexiconBeamOptions a None token beam means every token."""
    if beam_size_token is not None and (isinstance(beam_size_token, bool) or not isinstance(beam_size_token, int)
                                        or beam_size_token < 1):
        raise ValueError(f"beam_size_token must be an integer >= 1 (or None), got {beam_size_token!r}")
    if beam_threshold is not None and not beam_threshold >= 0:  # NaN fails too
        raise ValueError(f"beam_threshold must be >= 0 (inf: no threshold), got {beam_threshold}")


def check_rescore_weight(beam_size: int | None, rescore_weight: float | None) -> None:
    """Attention rescoring reranks a beam's n-best: its weight needs ``beam_size`` and lies in [0, 1]."""
    if rescore_weight is None:
        return
    if beam_size is None:
        raise ValueError("rescore_weight ranks a beam search's hypotheses: give beam_size too")
    if isinstance(rescore_weight, bool) or not 0.0 <= rescore_weight <= 1.0:
        raise ValueError(f"rescore_weight must be in [0, 1] (the attention score's share), got {rescore_weight!r}")


def check_graph_options(decoding_graph: str | None, beam_size: int | None, lm: str | None, lexicon: str | None,
                        hotwords: tuple = ()) -> None:
    """A decoding graph holds the lexicon and the language model and is searched with its own score beam: the
    prefix beam's options have nothing to steer there, so they are refused rather than ignored."""
    if decoding_graph is None:
        return
    if not str(decoding_graph).strip():
        raise ValueError("decoding_graph is empty: give the path of an OpenFst graph file")
    given = [name for name, value in (("beam_size", beam_size), ("lm", lm), ("lexicon", lexicon),
                                      ("hotwords", hotwords or None)) if value is not None]
    if given:
        raise ValueError(f"decoding_graph decodes over the graph with its own beam: it does not combine with "
                         f"{', '.join(given)}")


@dataclass(frozen=True)
class FallbackOptions:
    """openai-whisper's checks on each window of sequential long-form decoding. A window whose text compresses
    too well (``compression_ratio_threshold``: repetition loops) or whose average token log-probability is too
    low (``logprob_threshold``) is decoded again at the next of ``temperatures``. A window whose ``<|nospeech|>``
    probability exceeds ``no_speech_threshold`` while its log-probability is low is taken as silence and
    skipped. ``temperatures=(0.0,)`` turns the fallback off (the no-speech check still applies); ``None``
    disables a check."""

    temperatures: tuple[float, ...] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
    compression_ratio_threshold: float | None = 2.4
    logprob_threshold: float | None = -1.0
    no_speech_threshold: float | None = 0.6

    def __post_init__(self) -> None:
        if not self.temperatures or any(not 0.0 <= t <= 2.0 for t in self.temperatures):
            raise ValueError(f"temperatures must be a non-empty tuple of values in [0, 2], got {self.temperatures}")


@dataclass(frozen=True)
class TranscribeOptions:
    """What to decode. ``language=None`` means the model's only language, or detection on multilingual models."""

    language: str | None = None
    task: Task = "transcribe"
    target_language: str | None = None  # see DecodeOptions
    punctuation: bool = True
    batch_size: int = 16
    vad: str | None = None  # a VAD detector spec (oasr.vad: NAME or NAME:FOLDER): long audio is cut at its silences
    word_timestamps: bool = False  # fill ``Segment.words`` (Whisper checkpoints; costs one more encoder pass)
    # "parallel": audio longer than one window is cut into consecutive 30 s windows decoded independently (fast);
    # "sequential": openai-whisper's loop, each window starting at the last timestamp of the one before and
    # conditioned on its text (always with timestamps).
    long_form: LongForm = "parallel"
    timestamps: bool = False  # timestamp tokens -> segments with real start/end (always on in sequential mode)
    prompt: str | None = None  # text the first window (sequential) or every window (parallel) is conditioned on
    condition_on_previous_text: bool = True  # sequential: each window sees the text decoded before it
    # Sequential windows, and parallel windows decoded with timestamps (every window of a long input).
    fallback: FallbackOptions = field(default_factory=FallbackOptions)
    # Beam search (see ``DecodeOptions``). Sequential mode searches only at temperature 0 and samples the fallback
    # temperatures, as openai-whisper's ``transcribe()`` does.
    beam_size: int | None = None
    patience: float | None = None
    length_penalty: float | None = None
    # Word-level beam search (see ``DecodeOptions``): CTC models.
    lm: str | None = None
    lexicon: str | None = None
    lm_weight: float | None = None
    word_bonus: float | None = None
    beam_size_token: int | None = None  # see DecodeOptions
    beam_threshold: float | None = None
    hotwords: tuple[Hotword, ...] = ()  # see DecodeOptions
    decoding_graph: str | None = None  # see DecodeOptions: CTC models
    rescore_weight: float | None = None  # see DecodeOptions: CTC + attention models
    # A punctuation model folder (FunASR's CT-Transformer) whose marks are added to each result after decoding,
    # for models that write no punctuation (``oasr.transcription.punctuation``).
    punctuate: str | None = None

    def __post_init__(self) -> None:
        check_beam_options(self.beam_size, self.patience, self.length_penalty)
        object.__setattr__(self, "hotwords", tuple(self.hotwords))  # a list would not hash (requests group by it)
        check_lm_options(self.beam_size, self.lm, self.lexicon, self.lm_weight, self.word_bonus, self.beam_size_token,
                         self.beam_threshold)
        check_graph_options(self.decoding_graph, self.beam_size, self.lm, self.lexicon, self.hotwords)
        check_rescore_weight(self.beam_size, self.rescore_weight)
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.task not in ("transcribe", "translate"):
            raise ValueError(f"task must be 'transcribe' or 'translate', got {self.task!r}")
        if self.vad is not None:
            from oasr.vad import detector_name

            detector_name(self.vad)  # NAME or NAME:FOLDER; an unknown name is refused here
        if self.long_form not in LONG_FORM_MODES:
            raise ValueError(f"long_form must be one of {', '.join(LONG_FORM_MODES)}, got {self.long_form!r}")
        if self.vad is not None and self.long_form == "sequential":
            raise ValueError("vad cuts windows for the parallel long-form mode; sequential mode seeks by timestamps")


@dataclass(frozen=True)
class DecodeOptions:
    """Per-request options. ``language=None`` lets a multilingual model detect it."""

    language: str | None = None
    task: Task = "transcribe"
    # The language to write (models that translate between many, as Canary): None = the source language, or
    # English for ``task="translate"``.
    target_language: str | None = None
    punctuation: bool = True  # punctuation and capitals, on models that can leave them out (Canary's <|nopnc|>)
    max_new_tokens: int | None = None  # default: whatever the decoder's positions allow
    min_new_tokens: int = 0  # end-of-text is suppressed before this many tokens (fixed-length benchmarks)
    timestamps: bool = False  # decode timestamp tokens (openai-whisper's rules) instead of <|notimestamps|>
    temperature: float = 0.0  # 0: greedy; above: sampling from softmax(logits / temperature)
    # Text to condition on, placed after <|startofprev|> (openai-whisper's ``prompt``): either plain text or,
    # as the long-form driver passes previous windows' output, token ids. At most one of the two.
    prompt: str | None = None
    prompt_token_ids: tuple[int, ...] = ()
    # Beam search (openai-whisper's ``BeamSearchDecoder``): None decodes greedily; N keeps the N likeliest
    # unfinished hypotheses (N decode rows) and, at 1, gives the greedy tokens. The search ends once
    # round(N * patience) hypotheses have ended (patience None = 1). The finished ones are ranked by their summed
    # log-probability divided by their length (length_penalty None) or by ((5 + length) / 6) ** length_penalty.
    # Beam search is deterministic: it needs temperature 0.
    beam_size: int | None = None
    patience: float | None = None
    length_penalty: float | None = None
    # Word-level beam search (CTC models, ``oasr.decode.ctc_lexicon_beam``): ``lm`` a KenLM file (ARPA or binary),
    # ``lexicon`` a file of words, one a line (default: the ARPA file's words); the search emits only lexicon
    # words and adds ``lm_weight`` (default 0.5) x the LM's log10 probability and ``word_bonus`` (default 0) per
    # word. It prunes as flashlight's LexiconDecoder: per frame only the ``beam_size_token`` likeliest tokens
    # (default: all) start lexicon moves, and candidates below the frame's best minus ``beam_threshold``
    # (default 50, natural-log units; inf: none) are dropped before merging.
    lm: str | None = None
    lexicon: str | None = None
    lm_weight: float | None = None
    word_bonus: float | None = None
    beam_size_token: int | None = None
    beam_threshold: float | None = None
    # Hotwords (``oasr.decode.hotwords``): a beam search adds each phrase's boost per token of it that a
    # hypothesis spells, and keeps it for completed phrases only.
    hotwords: tuple[Hotword, ...] = ()
    # WFST decoding (CTC models, ``oasr.decode.ctc_wfst``): an OpenFst HLG/TLG graph file (tokens in, words out)
    # searched with Kaldi's FasterDecoder instead of greedy or prefix-beam decoding.
    decoding_graph: str | None = None
    # Attention rescoring (CTC + attention models, ``oasr.decode.attention_rescoring``): the beam's n-best is
    # ranked by rescore_weight x the attention decoder's log-probability + (1 - rescore_weight) x its CTC score
    # (None: the model's default, 0.5).
    rescore_weight: float | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        check_beam_options(self.beam_size, self.patience, self.length_penalty)
        object.__setattr__(self, "hotwords", tuple(self.hotwords))  # a list would not hash (requests group by it)
        check_lm_options(self.beam_size, self.lm, self.lexicon, self.lm_weight, self.word_bonus, self.beam_size_token,
                         self.beam_threshold)
        check_graph_options(self.decoding_graph, self.beam_size, self.lm, self.lexicon, self.hotwords)
        check_rescore_weight(self.beam_size, self.rescore_weight)
        if self.beam_size is not None and self.temperature > 0:
            raise ValueError(f"beam search is deterministic: it takes temperature 0, got {self.temperature} "
                             "(sample with beam_size=None)")
        if self.prompt is not None and self.prompt_token_ids:
            raise ValueError("give the prompt as text or as token ids, not both")

    @property
    def num_decode_rows(self) -> int:
        """Decode rows (and self-attention caches) a request with these options holds while it decodes."""
        return self.beam_size or 1


def word_search_fields(options: DecodeOptions | TranscribeOptions, keep: bool = True) -> dict[str, Any]:
    """The fields that steer a beam search beyond its size (lm, lexicon, lm_weight, word_bonus, beam_size_token,
    beam_threshold, rescore_weight, hotwords) to pass on, or (``keep=False``) their defaults, for a window that
    samples instead of searching; and what needs no beam_size and so goes with every window: the decoding graph,
    and hotwords given without one (a model whose network takes them: ``hotwords_need_beam`` False)."""
    fields = {"lm": options.lm, "lexicon": options.lexicon, "lm_weight": options.lm_weight,
              "word_bonus": options.word_bonus, "beam_size_token": options.beam_size_token,
              "beam_threshold": options.beam_threshold, "rescore_weight": options.rescore_weight}
    searched = fields if keep else dict.fromkeys(fields)
    hotwords = options.hotwords if keep or options.beam_size is None else ()
    return {**searched, "hotwords": hotwords, "decoding_graph": options.decoding_graph}


@dataclass(frozen=True)
class Word:
    """One word and when it was spoken (seconds from the input's start), from cross-attention alignment.
    ``word`` keeps its leading space and any punctuation merged into it, as Whisper's word timestamps do."""

    word: str
    start: float
    end: float
    probability: float


@dataclass(frozen=True)
class Segment:
    """A span of the input with its text (stripped). With timestamps, one per pair of timestamp tokens;
    without, one per 30 s decoding window. The decoding details are those of the window it came from
    (``None`` where the decode did not report them)."""

    start: float
    end: float
    text: str
    words: tuple[Word, ...] = ()
    token_ids: tuple[int, ...] = ()  # as decoded, timestamp tokens included
    temperature: float = 0.0
    avg_logprob: float | None = None
    compression_ratio: float | None = None
    no_speech_prob: float | None = None


@dataclass
class Transcription:
    """One input's result. ``error`` is set (and ``text`` empty) when the input could not be transcribed."""

    source: str
    text: str
    language: str | None
    duration_s: float
    token_ids: list[int] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_dict(self) -> dict[str, Any]:
        values = asdict(self)
        return {"file": values.pop("source"), **values}
