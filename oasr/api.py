"""The Python API: ``oasr.transcribe`` and ``oasr.from_pretrained``."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import torch

from oasr.engine.config import EngineConfig
from oasr.transcription.offline import AudioInput, OfflineTranscriber, ProgressCallback, calibration_feed, no_progress
from oasr.errors import TranscriptionFailedError
from oasr.models import loader
from oasr.models.loader import LoadedModel
from oasr.types import Hotword, LongForm, Task, Transcription, TranscribeOptions, parse_hotwords


def from_pretrained(name_or_path: str | Path = "tiny.en", **options) -> LoadedModel:
    """``oasr.from_pretrained``: ``oasr.models.loader.from_pretrained`` (the same options) with the offline
    transcriber as the calibration a quantization at load runs (int8's SmoothQuant), which the loader, below the
    transcriber, is handed rather than imports."""
    options.setdefault("calibration_feed", calibration_feed)
    return loader.from_pretrained(name_or_path, **options)


def _as_list(inputs: AudioInput | Sequence[AudioInput]) -> list[AudioInput]:
    if isinstance(inputs, (str, os.PathLike, bytes, np.ndarray)):
        return [inputs]
    return list(inputs)


def iter_transcribe(
    inputs: AudioInput | Sequence[AudioInput],
    model: str | Path | LoadedModel = "tiny.en",
    *,
    options: TranscribeOptions | None = None,
    device: str | torch.device = "auto",
    dtype: str | torch.dtype | None = None,
    on_progress: ProgressCallback = no_progress,
    config: EngineConfig | None = None,
) -> Iterator[Transcription]:
    """Like ``transcribe`` but yields results as they finish; failed inputs yield results with ``error`` set.
    ``on_progress(found_s, done_s)`` is told the seconds of audio of each input once decoded, and the seconds
    each finished window covers (a progress bar in audio seconds, moving within long inputs too). ``config``:
    the engine's configuration (``batch_size`` still sets its rows)."""
    loaded = model if isinstance(model, LoadedModel) else from_pretrained(model, device=device, dtype=dtype)
    transcriber = OfflineTranscriber(loaded, options or TranscribeOptions(), config)
    yield from transcriber.run(_as_list(inputs), on_progress)


def transcribe(
    inputs: AudioInput | Sequence[AudioInput],
    model: str | Path | LoadedModel = "tiny.en",
    *,
    language: str | None = None,
    task: Task = "transcribe",
    target_language: str | None = None,
    punctuation: bool = True,
    batch_size: int = 16,
    long_form: LongForm = "parallel",
    timestamps: bool = False,
    prompt: str | None = None,
    options: TranscribeOptions | None = None,
    device: str | torch.device = "auto",
    dtype: str | torch.dtype | None = None,
    skip_errors: bool = False,
    word_timestamps: bool = False,
    vad: str | None = None,
    beam_size: int | None = None,
    patience: float | None = None,
    length_penalty: float | None = None,
    lm: str | None = None,
    lexicon: str | None = None,
    lm_weight: float | None = None,
    word_bonus: float | None = None,
    beam_size_token: int | None = None,
    beam_threshold: float | None = None,
    hotwords: str | Sequence[Hotword] = (),
    decoding_graph: str | None = None,
    rescore_weight: float | None = None,
    punctuate: str | Path | None = None,
) -> list[Transcription]:
    """Transcribes audio files, bytes or 16 kHz float arrays: one ``Transcription`` per input, in input order.

    An input that fails (missing, not audio, empty) never stops the others. With ``skip_errors`` its result
    carries ``error`` (and empty text; ``result.ok`` is False) and the list is returned; without it (the
    default) every input still runs, then ``TranscriptionFailedError`` (an ``AudioDecodeError`` naming the first
    failure) is raised, holding every result in ``.results`` and the failed ones in ``.failures``.

    ``long_form="sequential"`` decodes audio longer than 30 s as openai-whisper's ``transcribe()`` does (with
    timestamps, conditioning on previous text, temperature fallback); ``timestamps=True`` gives segments with
    real start and end times in parallel mode too. ``word_timestamps`` fills each segment's ``words`` (Whisper
    checkpoints; in sequential mode windows then resume from their last word's end, as openai-whisper's do);
    ``vad`` names a detector (``oasr.vad``) that cuts parallel long-form windows at silences.
    ``target_language`` is the language to write on models that translate between many (Canary), and
    ``punctuation=False`` asks them for text without punctuation and capitals.
    ``beam_size`` decodes by beam search (openai-whisper's, with ``patience`` and ``length_penalty``) instead of
    greedily; each window then decodes on ``beam_size`` rows. On CTC models, ``lm`` (a KenLM file) and ``lexicon``
    (words, one a line) make it a word-level search weighted by ``lm_weight`` and ``word_bonus`` and pruned by
    ``beam_size_token`` and ``beam_threshold`` (flashlight's knobs, ``oasr.decode.ctc_lexicon_beam``); ``hotwords``
    (``Hotword``s, or ``"phrase[:boost],..."`` / ``"@FILE"``) favours phrases in the search. ``decoding_graph``
    (CTC models: an OpenFst HLG/TLG graph file) decodes over that graph instead (``oasr.decode.ctc_wfst``).
    ``rescore_weight`` (CTC + attention models, with ``beam_size``) is the attention decoder's share of the score
    its n-best is reranked by (``oasr.decode.attention_rescoring``).
    ``punctuate`` (a FunASR CT-Transformer folder) adds punctuation to the results of a model that writes none
    (FunASR's Paraformer), words keeping their times (``oasr.transcription.punctuation``).
    ``options`` (a full ``TranscribeOptions``) replaces the keyword options before it."""
    if options is None:
        options = TranscribeOptions(language=language, task=task, target_language=target_language,
                                    punctuation=punctuation, batch_size=batch_size, long_form=long_form,
                                    timestamps=timestamps, prompt=prompt, word_timestamps=word_timestamps, vad=vad,
                                    beam_size=beam_size, patience=patience, length_penalty=length_penalty,
                                    lm=lm, lexicon=lexicon, lm_weight=lm_weight, word_bonus=word_bonus,
                                    beam_size_token=beam_size_token, beam_threshold=beam_threshold,
                                    hotwords=parse_hotwords(hotwords) if isinstance(hotwords, str) else tuple(hotwords),
                                    decoding_graph=decoding_graph, rescore_weight=rescore_weight,
                                    punctuate=None if punctuate is None else str(punctuate))
    results = list(iter_transcribe(inputs, model, options=options, device=device, dtype=dtype))
    failures = [result for result in results if result.error]
    if failures and not skip_errors:
        raise TranscriptionFailedError(results, failures)
    return results
