"""``oasr transcribe``: inputs (files, a manifest) -> what is left to do (resumed --output-dir runs) -> a local run
or a Ray Data run (``oasr.scale.ray_transcribe``) -> output files or stdout."""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from oasr.devices import is_cuda
from oasr.diarization.assign import DiarizedTranscription
from oasr.serving.diarization_formats import DIARIZED_FORMATS, labelled_dict, render_diarized
from oasr.serving.formats import render, render_many

if TYPE_CHECKING:
    from oasr.scale.inputs import TranscribeInput
    from oasr.scale.ray_transcribe import RayOptions
    from oasr.types import TranscribeOptions, Transcription


def engine_config_of(args: argparse.Namespace):
    """The ``EngineConfig`` a command's --kv-cache-dtype asks for (None: the defaults); ``oasr serve`` reads it
    here too."""
    if args.kv_cache_dtype == "auto":
        return None
    from oasr.engine.config import CacheConfig, EngineConfig

    return EngineConfig(cache=CacheConfig(kv_cache_dtype=args.kv_cache_dtype))


def output_names(files: Sequence[Path]) -> list[str]:
    """The --output-dir stem of each input file (``oasr.scale.inputs.output_names``)."""
    from oasr.scale.inputs import TranscribeInput, output_names as names_of

    return names_of([TranscribeInput(f) for f in files])


def write_output(target: Path, text: str) -> None:
    """Writes through a hidden partial file renamed into place, so a failed write (a full disk) leaves no
    truncated output behind. The partial file's name is random and created exclusively, so runs writing the
    same directory at once never share one: each replace is atomic, and the last one wins."""
    partial = _exclusive_partial(target)
    try:
        with partial.open("w", encoding="utf-8") as out:
            out.write(text)
        os.replace(partial, target)
    except OSError:
        partial.unlink(missing_ok=True)
        raise


def _exclusive_partial(target: Path) -> Path:
    """A new, empty ``.NAME.RANDOM.partial`` beside ``target``, created by this call alone (O_EXCL), with the
    permissions a plain open would give (the umask applies, unlike ``tempfile.mkstemp``'s 0600)."""
    while True:
        partial = target.with_name(f".{target.name}.{secrets.token_hex(6)}.partial")
        try:
            os.close(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            return partial
        except FileExistsError:  # 48 random bits taken already: draw again
            continue


class StdoutError(Exception):
    """stdout refused a write (a full disk, a closed pipe): nothing more can be printed."""


def _print(text: str) -> None:
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except OSError as exc:
        raise StdoutError(exc.strerror or str(exc)) from None


def _transcribe_options(args: argparse.Namespace, *, timed_model: bool = True,
                        timed_words: bool = False) -> TranscribeOptions:
    """The options of ``args``; subtitles (and speaker turns) imply timestamps where the model decodes them
    (``timed_model``), and come from the windows' own times elsewhere. With a diarization model, words are timed
    where the model can time them (``timed_words``), so that segments split where the speaker changes."""
    from oasr.types import FallbackOptions, TranscribeOptions, parse_hotwords

    timed_formats = ("srt", "vtt", "diarized_json")
    return TranscribeOptions(
        language=args.language, task=args.task, target_language=args.target_language,
        punctuation=not args.no_punctuation, batch_size=args.batch_size, long_form=args.long_form,
        timestamps=args.timestamps or (timed_model and args.output_format in timed_formats), prompt=args.prompt,
        fallback=FallbackOptions(temperatures=(0.0,)) if args.no_fallback else FallbackOptions(), vad=args.vad,
        word_timestamps=args.word_timestamps or (timed_words and args.diarization_model is not None),
        beam_size=args.beam_size, patience=args.patience, length_penalty=args.length_penalty, lm=args.lm,
        lexicon=args.lexicon, lm_weight=args.lm_weight, word_bonus=args.word_bonus,
        beam_size_token=args.beam_size_token, beam_threshold=args.beam_threshold,
        hotwords=parse_hotwords(args.hotwords) if args.hotwords else (), decoding_graph=args.decoding_graph,
        rescore_weight=args.rescore_weight,
        punctuate=args.punctuate,
    )


def _check_output_dir(output_dir: Path | None) -> str | None:
    """Why --output-dir cannot be used, found before any model loads (None when it can)."""
    if output_dir is None:
        return None
    if output_dir.exists() and not output_dir.is_dir():
        return f"--output-dir {output_dir} exists and is not a directory"
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"--output-dir {output_dir}: {exc.strerror or exc}"
    return None


def run(args: argparse.Namespace) -> int:
    """``oasr transcribe``: files and a manifest, locally or on Ray, into --output-dir or stdout."""
    from oasr.scale.inputs import output_names as names_of

    try:
        options = _transcribe_options(args)
        ray_options = _ray_options(args)
    except ValueError as exc:
        print(f"oasr: error: {exc}", file=sys.stderr)
        return 2
    problem = (_check_output_dir(args.output_dir) or _mode_conflict(args)
               or _diarization_conflict(args, ray_options is not None))
    if problem:
        print(f"oasr: error: {problem}", file=sys.stderr)
        return 2
    inputs = _inputs(args)
    if not inputs:
        print("oasr: error: nothing to transcribe: give audio files or --manifest", file=sys.stderr)
        return 2
    problem = _stdout_conflict(args, len(inputs))
    if problem:
        print(f"oasr: error: {problem}", file=sys.stderr)
        return 2
    names = names_of(inputs)
    todo = _unfinished(args, names)
    if not todo:
        return 0
    paths = [inputs[i].path for i in todo]
    if ray_options is not None:
        results, progress = _ray_results(args, paths, options, ray_options)
    else:
        results, progress = _local_results(args, paths)
    if args.diarization_model is not None:
        results = _with_speakers(args, paths, results)
    try:
        failed = _emit(args, [names[i] for i in todo], results, progress)
    finally:
        progress.close()
    return 1 if failed else 0


# Formats whose output is one document (a header, numbered cues): several of them end to end are not one valid
# file, so several inputs need --output-dir.
SINGLE_DOCUMENT_FORMATS = ("srt", "vtt", "diarized_json")


def _diarization_conflict(args: argparse.Namespace, on_ray: bool) -> str | None:
    """Why --diarization-model cannot serve this run (None when it can)."""
    if args.output_format == "diarized_json" and args.diarization_model is None:
        return "--output-format diarized_json needs --diarization-model ID: the speakers come from that model"
    if args.diarization_model is not None and args.output_format not in DIARIZED_FORMATS:
        return (f"--output-format {args.output_format} has no place for speakers; with --diarization-model choose "
                f"one of {', '.join(DIARIZED_FORMATS)}")
    if args.diarization_model is not None and (on_ray or args.stream):
        return "--diarization-model runs only with local whole-file transcription (not --stream, not on Ray)"
    return None


def _with_speakers(args: argparse.Namespace, paths: list[Path], results):
    """Each transcribed input with its speaker activity: the diarization model runs on the same file."""
    from oasr.audio import load_audio
    from oasr.diarization.loader import load_diarizer
    from oasr.diarization.offline import OfflineDiarizer

    diarizer = OfflineDiarizer(load_diarizer(args.diarization_model, device=args.device,
                                             dtype=None if args.dtype == "auto" else args.dtype))
    for index, result in results:
        if result.ok:
            activity = diarizer.diarize([load_audio(paths[index])], [str(paths[index])])[0].segments
            result = DiarizedTranscription(result, activity)
        yield index, result


def _render(result, fmt: str) -> str:
    """A result in ``fmt``, with its speakers where it has them."""
    return render_diarized(result, fmt) if isinstance(result, DiarizedTranscription) else render(result, fmt)


def _json_array(results: list) -> str:
    """Several results on stdout as one JSON array; transcripts with speakers carry them."""
    if not any(isinstance(r, DiarizedTranscription) for r in results):
        return render_many(results, "json")
    bodies = [labelled_dict(r) if isinstance(r, DiarizedTranscription) else r.to_dict() for r in results]
    return json.dumps(bodies, ensure_ascii=False, indent=2) + "\n"


def _stdout_conflict(args: argparse.Namespace, num_inputs: int) -> str | None:
    """Why the inputs cannot all go to stdout in --output-format (None when they can), found before any model
    loads."""
    if args.output_dir is None and num_inputs > 1 and args.output_format in SINGLE_DOCUMENT_FORMATS:
        return (f"--output-format {args.output_format} makes one document per input and cannot put {num_inputs} "
                f"inputs on stdout: give --output-dir DIR (one .{args.output_format} per input there), or use "
                "--output-format jsonl for one line per input")
    return None


def stdout_text(result: Transcription, fmt: str, several: bool) -> str:
    """What stdout shows of one result; with several inputs, each txt line starts with the input's name and a
    colon, as grep prints matches from several files (one input prints its text alone)."""
    if fmt == "txt" and several:
        return "".join(f"{result.source}: {line}\n" for line in result.text.split("\n"))
    return _render(result, fmt)


def _inputs(args: argparse.Namespace) -> list[TranscribeInput]:
    """The FILES, then the --manifest's entries (``ManifestError``, an OASRError, names a bad line)."""
    from oasr.scale.inputs import TranscribeInput, read_manifest

    inputs = [TranscribeInput(f) for f in args.files]
    if args.manifest is not None:
        inputs += read_manifest(args.manifest)
    return inputs


def _unfinished(args: argparse.Namespace, names: list[str]) -> list[int]:
    """The inputs to transcribe: all of them, or with --output-dir those whose output is not there yet."""
    from oasr.scale.inputs import unfinished

    if args.output_dir is None or args.overwrite:
        return list(range(len(names)))
    todo = unfinished(names, args.output_dir, args.output_format)
    if len(todo) < len(names):
        print(f"oasr: skipping {len(names) - len(todo)} of {len(names)} inputs whose output is already in "
              f"{args.output_dir} (--overwrite transcribes them again)", file=sys.stderr)
    return todo


def _progress_bar(args: argparse.Namespace, unit: str, total: float = 0):
    from tqdm import tqdm

    return tqdm(total=total, unit=unit, unit_scale=True, disable=True if args.quiet else None, file=sys.stderr,
                bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f} " + unit + " [{elapsed}<{remaining}]")


def _local_results(args: argparse.Namespace, paths: list[Path]):
    from oasr.api import from_pretrained, iter_transcribe
    from oasr.models.capabilities import capabilities_of

    loaded = from_pretrained(args.model, device=args.device, dtype=None if args.dtype == "auto" else args.dtype,
                             quantization=args.quantization)
    capabilities = capabilities_of(type(loaded.model))
    options = _transcribe_options(args, timed_model="timestamps" in capabilities.options,
                                  timed_words=capabilities.word_timing)
    config = engine_config_of(args)
    # Audio seconds, not files, so that one long input moves the bar too; tqdm hides it off a terminal.
    progress = _progress_bar(args, "audio s")

    def on_progress(found_s: float, done_s: float) -> None:
        if found_s:
            progress.total += found_s
            progress.refresh()
        if done_s:
            progress.update(done_s)

    if args.stream:
        results = _streamed(args, loaded, paths)
    else:
        results = iter_transcribe(paths, loaded, options=options, on_progress=on_progress, config=config)
    return enumerate(results), progress


def _ray_results(args: argparse.Namespace, paths: list[Path], options: TranscribeOptions, ray_options: RayOptions):
    """Results from a Ray cluster as they come; the bar counts files (audio lengths are known only remotely)."""
    from oasr.scale.ray_transcribe import WorkerSpec, transcribe_on_ray

    model = os.path.abspath(args.model) if os.path.isdir(args.model) else args.model  # actors' cwd may differ
    spec = WorkerSpec(model=model, device=args.device, dtype=None if args.dtype == "auto" else args.dtype,
                      options=_transcribe_options(args, timed_model=False),
                      timed_options=_transcribe_options(args, timed_model=True), batch_size=options.batch_size,
                      quantization=args.quantization, config=engine_config_of(args))
    progress = _progress_bar(args, "files", total=len(paths))

    def counted():
        for index, result in transcribe_on_ray(paths, spec, ray_options):
            progress.update(1)
            yield index, result

    return counted(), progress


def _emit(args: argparse.Namespace, names: list[str], results, progress) -> int:
    """Writes each ``(index, result)`` (in any order) as the local run does: into --output-dir as it comes, or
    on stdout in input order; returns how many inputs failed."""
    failed, collected, held, next_index = 0, [], {}, 0
    for index, result in results:
        if result.error:
            failed += 1
            progress.write(f"oasr: error: {result.error}", file=sys.stderr)
        elif args.output_dir:
            target = args.output_dir / f"{names[index]}.{args.output_format}"
            try:
                write_output(target, _render(result, args.output_format))
            except OSError as exc:
                failed += 1
                progress.write(f"oasr: error: cannot write {target}: {exc.strerror or exc}", file=sys.stderr)
        if args.output_dir:
            continue
        held[index] = None if result.error else result
        while next_index in held:  # stdout keeps input order
            ready = held.pop(next_index)
            next_index += 1
            if ready is None:
                continue
            if args.output_format == "json":
                collected.append(ready)
            else:
                _print(stdout_text(ready, args.output_format, several=len(names) > 1))
    if collected:
        _print(_json_array(collected))
    return failed


def _ray_options(args: argparse.Namespace) -> RayOptions | None:
    """The --ray-* options, or None for a local run."""
    if args.ray_workers is None:
        if args.ray_address is not None or args.gpus_per_worker:
            raise ValueError("--ray-address and --gpus-per-worker need --ray-workers")
        return None
    if is_cuda(args.device) and not args.gpus_per_worker:
        raise ValueError("--device cuda with --ray-workers needs --gpus-per-worker (Ray hides GPUs from actors "
                         "that reserve none)")
    from oasr.scale.ray_transcribe import RayOptions

    return RayOptions(num_workers=args.ray_workers, address=args.ray_address, gpus_per_worker=args.gpus_per_worker)


def _mode_conflict(args: argparse.Namespace) -> str | None:
    """Why the --stream / --ray-workers choice cannot run (None when it can)."""
    if args.stream:
        if args.ray_workers is not None:
            return "--stream cannot be combined with --ray-workers"
        if args.kv_cache_dtype != "auto":
            return "--kv-cache-dtype applies to decoders with attention caches; --stream runs none"
        return _stream_conflict(args)
    if args.chunk_ms is not None or args.endpointing or args.final_model is not None:
        return "--chunk-ms, --endpointing and --final-model need --stream"
    if args.ray_workers is not None:
        from oasr.scale.ray_transcribe import RAY_MISSING, ray_data_available

        if not ray_data_available():
            return RAY_MISSING
    return None


def _stream_conflict(args: argparse.Namespace) -> str | None:
    """The first option --stream cannot serve (None when all can be)."""
    for flag, value in (("--timestamps", args.timestamps), ("--word-timestamps", args.word_timestamps),
                        ("--vad", args.vad), ("--beam-size", args.beam_size), ("--prompt", args.prompt),
                        ("--long-form sequential", args.long_form == "sequential"),
                        ("--task translate", args.task == "translate")):
        if value:
            return f"--stream cannot be combined with {flag}"
    return None


def _streamed(args: argparse.Namespace, loaded, paths: list[Path]):
    from oasr.streaming.endpointing import EndpointConfig
    from oasr.transcription.streamed import StreamTranscriber, StreamTranscribeOptions

    options = StreamTranscribeOptions(chunk_ms=args.chunk_ms, language=args.language,
                                      endpointing=EndpointConfig() if args.endpointing else None,
                                      final_model=args.final_model)
    results = StreamTranscriber(loaded, options).run(paths)
    return _punctuated(args.punctuate, loaded, results) if args.punctuate else results


def _punctuated(folder: str, loaded, results):
    """Streamed files' final transcripts with punctuation added (--punctuate), checked and loaded before the first."""
    from oasr.models.capabilities import capabilities_of
    from oasr.transcription.punctuation import punctuator_for

    punctuator = punctuator_for(folder, capabilities_of(type(loaded.model)), loaded.name, str(loaded.device))
    return (punctuator.transcriptions([result])[0] for result in results)
