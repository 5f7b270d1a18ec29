"""What an architecture can serve, declared once on its class and read everywhere.

Every architecture class carries ``capabilities``: a frozen ``ModelCapabilities`` naming the runner kind that
serves it (``oasr.engine.runners``), its decode strategies (the first is the default; a strategy that searches
serves ``DecodeOptions.beam_size``), the request options it serves beyond the defaults, its tasks, whether it
times words, how it streams and which norms feed which GEMMs (SmoothQuant). The engine picks its runner by
``runner`` and refuses a request with ``check_options`` before anything is queued; the servers and the CLI read
the same record to say what a model can do. Nothing probes a model class with ``getattr``.
"""

from __future__ import annotations

from dataclasses import MISSING, Field, dataclass, fields

from oasr.errors import UnsupportedOptionError
from oasr.quantization.spec import SmoothGroup
from oasr.types import LONG_FORM_MODES, DecodeOptions

RUNNER_KINDS = ("autoregressive", "frame_sync")

# Request options an architecture may serve, each the DecodeOptions fields it covers. ``max_new_tokens`` is
# served by every architecture (it only bounds the output), and beam search is served through a strategy.
OPTION_FIELDS: dict[str, tuple[str, ...]] = {
    "language": ("language",),
    "target_language": ("target_language",),
    "punctuation": ("punctuation",),
    "timestamps": ("timestamps",),
    "prompt": ("prompt", "prompt_token_ids"),
    "temperature": ("temperature",),
    "min_new_tokens": ("min_new_tokens",),
    "beam_size": ("beam_size", "patience", "length_penalty"),
    "language_model": ("lm", "lexicon", "lm_weight", "word_bonus", "beam_size_token", "beam_threshold"),
    "hotwords": ("hotwords",),
    "decoding_graph": ("decoding_graph",),
    "rescoring": ("rescore_weight",),
}
_ALWAYS_SERVED = ("max_new_tokens", "task")  # task is checked against ``tasks``


def decoder_step_gemms(layers: str, mlp: tuple[str, ...]) -> tuple[str, ...]:
    """An encoder-decoder's decode-step GEMMs (``ModelCapabilities.decode_step_gemms``): each decoder layer's
    self-attention projections, its cross-attention query and output projections and ``mlp`` (paths under the
    layer). Not the cross-attention keys and values: they project a request's encoder output once."""
    return (*(f"{layers}.self_attn.{p}_proj" for p in ("q", "k", "v", "out")),
            f"{layers}.encoder_attn.q_proj", f"{layers}.encoder_attn.out_proj", *(f"{layers}.{m}" for m in mlp))


@dataclass(frozen=True)
class ModelCapabilities:
    runner: str  # a runner kind: "autoregressive" (a decoder step per token) or "frame_sync" (done in the encode walk)
    decode_strategies: tuple[str, ...]  # names in DECODE_STRATEGIES; the first decodes by default
    options: frozenset[str] = frozenset()  # keys of OPTION_FIELDS the model serves (beam_size comes from strategies)
    tasks: tuple[str, ...] = ("transcribe",)
    word_timing: bool = False  # the architecture aligns words to audio, through ``aligner``
    # The ``WORD_ALIGNERS`` entry that times its words (``oasr.models.aligners``): set exactly with word_timing.
    aligner: str | None = None
    # The long-form drivers (``TranscribeOptions.long_form``) that can drive it: every model is driven by
    # "parallel" (windows decoded independently); "sequential" (openai-whisper's seek loop,
    # ``oasr.transcription.sequential``) needs timestamp tokens and features of the whole input.
    long_form: tuple[str, ...] = ("parallel",)
    streaming: str | None = None  # a streaming-runtime name, or None for offline models
    # The model writes tags of what it heard beside the text (SenseVoice: emotion, audio event), which its
    # tokenizer reads from a finished request's tokens (``audio_tags(token_ids) -> {kind: tag}``); the server
    # reports them as fields of verbose_json.
    audio_tags: bool = False
    # The model's text carries punctuation (and capitals) of its own. A model that writes none (FunASR's Paraformer
    # families) may have it added after decoding by a punctuator (``--punctuate``, ``oasr.models.punctuation``);
    # one that writes its own is refused one.
    writes_punctuation: bool = True
    # The longest audio one request holds, in seconds; None: the feature extractor's window (Whisper's 30 s).
    window_seconds: float | None = None
    # Which norms feed which GEMMs (module paths, ``*`` for a layer index), for SmoothQuant; empty: the model's
    # GEMMs are quantized without smoothing (``oasr.quantization``).
    smooth_groups: tuple[SmoothGroup, ...] = ()
    # The GEMMs every decode step runs, at a step's few rows (module paths, ``*`` for a layer index). Quantization
    # leaves them in the model's dtype unless asked: there 8 bits cost more passes than they save.
    decode_step_gemms: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.runner not in RUNNER_KINDS:
            raise ValueError(f"unknown runner kind {self.runner!r}; known: {', '.join(RUNNER_KINDS)}")
        if not self.decode_strategies:
            raise ValueError("an architecture needs at least one decode strategy")
        unknown = sorted(set(self.options) - set(OPTION_FIELDS))
        served_by_strategies = {"beam_size", "language_model", "hotwords", "decoding_graph"} & set(self.options)
        if unknown or served_by_strategies:
            raise ValueError(f"unknown or strategy-served options declared: {unknown or sorted(served_by_strategies)}")
        if self.word_timing != (self.aligner is not None):
            raise ValueError("word_timing and aligner go together: an architecture that times words names its aligner")
        if "parallel" not in self.long_form or not set(self.long_form) <= set(LONG_FORM_MODES):
            raise ValueError(f"long_form must include parallel, within {', '.join(LONG_FORM_MODES)}; got {self.long_form}")
        if not self.tasks or any(t not in ("transcribe", "translate") for t in self.tasks):
            raise ValueError(f"tasks must be a non-empty subset of transcribe, translate; got {self.tasks}")

    @property
    def default_strategy(self) -> str:
        return self.decode_strategies[0]

    @property
    def beam_strategy(self) -> str | None:
        """The strategy that serves ``beam_size`` (the first that searches), or None."""
        from oasr.decode import DECODE_STRATEGIES

        return next((name for name in self.decode_strategies if DECODE_STRATEGIES.get(name).searches), None)

    @property
    def graph_strategy(self) -> str | None:
        """The strategy that serves ``decoding_graph`` (the first that decodes over graphs), or None."""
        from oasr.decode import DECODE_STRATEGIES

        return next((name for name in self.decode_strategies if DECODE_STRATEGIES.get(name).decodes_graphs), None)

    @property
    def served_options(self) -> frozenset[str]:
        from oasr.decode import DECODE_STRATEGIES

        beam = self.beam_strategy
        strategy = DECODE_STRATEGIES.get(beam) if beam is not None else None
        by_strategy = {"beam_size": strategy is not None, "language_model": strategy is not None and strategy.fuses_lm,
                       "hotwords": strategy is not None and strategy.biases,
                       "decoding_graph": self.graph_strategy is not None,
                       "rescoring": strategy is not None and strategy.rescores}
        return self.options | {key for key, served in by_strategy.items() if served}

    @property
    def hotwords_need_beam(self) -> bool:
        """Whether a request's hotwords need ``beam_size`` beside them: they steer a search, unless the strategy
        that takes them biases the network's own output (``biases_greedy``)."""
        from oasr.decode import DECODE_STRATEGIES

        beam = self.beam_strategy
        return beam is None or not DECODE_STRATEGIES.get(beam).biases_greedy

    def strategy_for(self, options: DecodeOptions) -> str:
        """The strategy that decodes a request with ``options`` (check them first)."""
        if options.decoding_graph is not None:
            return self.graph_strategy
        searched = options.beam_size is not None or bool(options.hotwords)  # hotwords alone: checked to need none
        return self.beam_strategy if searched else self.default_strategy


def unserved_option(capabilities: ModelCapabilities, options: DecodeOptions) -> str | None:
    """The first option of ``options`` set away from its default that the model does not serve, or None."""
    served = {f for key in capabilities.served_options for f in OPTION_FIELDS[key]} | set(_ALWAYS_SERVED)
    for field in fields(DecodeOptions):
        if field.name not in served and getattr(options, field.name) != _default(field):
            return field.name
    return None


def _default(field: Field) -> object:
    return field.default if field.default is not MISSING else field.default_factory()  # type: ignore[misc]


def check_options(capabilities: ModelCapabilities, options: DecodeOptions, name: str) -> None:
    """Refuses options the model cannot serve, naming the option (``name``: the model, for the message)."""
    if options.task not in capabilities.tasks:
        raise UnsupportedOptionError(f"{name} cannot {options.task}: task {options.task!r} is not available "
                                     f"(it serves {', '.join(capabilities.tasks)})")
    option = unserved_option(capabilities, options)
    if option is not None:
        raise UnsupportedOptionError(f"{name} does not serve the option {option} "
                                     f"(got {getattr(options, option)!r})")
    if options.hotwords and options.beam_size is None and capabilities.hotwords_need_beam:
        raise UnsupportedOptionError(f"{name}: hotwords bias its beam search: give beam_size too")
    widest = _widest_beam(capabilities)
    if options.beam_size is not None and widest is not None and options.beam_size > widest:
        raise UnsupportedOptionError(f"{name} searches no wider than beam_size {widest}, got {options.beam_size}")


def _widest_beam(capabilities: ModelCapabilities) -> int | None:
    from oasr.decode import DECODE_STRATEGIES

    beam = capabilities.beam_strategy
    return DECODE_STRATEGIES.get(beam).widest_beam if beam is not None else None


def capabilities_of(arch: type) -> ModelCapabilities:
    """The record an architecture class declares; a class without one is a programming error."""
    record = arch.__dict__.get("capabilities") or getattr(arch, "capabilities", None)
    if not isinstance(record, ModelCapabilities):
        raise TypeError(f"architecture {arch.__name__} declares no ModelCapabilities (class attribute capabilities)")
    return record
