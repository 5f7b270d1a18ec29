"""``oasr transcribe --ray-workers N``: offline transcription spread over a Ray cluster with Ray Data.

The pipeline: the input paths -> audio decoded by Ray tasks on CPUs (``to_samples``, the local path's decoder)
-> batches of decoded audio transcribed by a pool of N actors, each holding one loaded model and its
``OfflineTranscriber`` -> results streamed back to the driver, which writes them as a local run does.

A file that cannot be decoded becomes a result with ``error`` set (the local run's message), so the rest go on.
An actor that dies is restarted by Ray and its batch run again (``max_restarts`` / ``max_task_retries``); the
driver keeps the first result of each input, so every input is written once, and raises ``RayRunError`` if one
never came back.

Ray is an optional dependency (``pip install 'oasr[ray]'``): this module imports it only when a run starts.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from oasr.errors import OASRError

if TYPE_CHECKING:
    from oasr.engine.config import EngineConfig
    from oasr.types import Transcription, TranscribeOptions

RAY_MISSING = "--ray-workers needs Ray Data, which is not installed: pip install 'oasr[ray]'"

# Restarts of one actor and reruns of one batch before the run fails: enough for a lost node or a crash, not an
# endless loop on a batch that kills every actor it is given.
MAX_ACTOR_RESTARTS = 3
MAX_BATCH_RETRIES = 3


class RayRunError(OASRError):
    """The Ray run could not finish (the cluster is unreachable, or a batch failed on every retry)."""


@dataclass(frozen=True)
class RayOptions:
    """Where and how wide to run."""

    num_workers: int  # transcribing actors, each with its own model
    address: str | None = None  # an existing cluster ("auto", "ray://host:10001", ...); None starts a local one
    gpus_per_worker: float = 0.0  # GPUs each actor reserves (fractions share a GPU)

    def __post_init__(self) -> None:
        if self.num_workers < 1:
            raise ValueError(f"--ray-workers must be >= 1 (got {self.num_workers})")
        if self.gpus_per_worker < 0:
            raise ValueError(f"--gpus-per-worker must be >= 0 (got {self.gpus_per_worker})")


@dataclass(frozen=True)
class WorkerSpec:
    """What every actor loads and how it decodes. ``timed_options`` replaces ``options`` on models that decode
    timestamps (subtitle formats ask for them), as the local run chooses once its model is loaded."""

    model: str
    device: str
    dtype: str | None
    options: TranscribeOptions
    timed_options: TranscribeOptions
    batch_size: int  # inputs handed to an actor at once
    quantization: str | None = None  # a method each actor quantizes a full-precision checkpoint with at load
    config: EngineConfig | None = None  # each actor's engine configuration (None: the defaults)


def ray_data_available() -> bool:
    try:
        import ray.data  # noqa: F401
    except ImportError:
        return False
    return True


def decode_row(row: dict[str, Any]) -> dict[str, Any]:
    """One input's audio as 16 kHz samples, or the local run's error message for it (a Ray Data ``map`` fn)."""
    from oasr.errors import AudioDecodeError
    from oasr.transcription.spans import to_samples

    name = row["name"]
    try:
        samples, error = to_samples(row["path"], name), ""
    except AudioDecodeError as exc:
        samples, error = np.zeros(0, dtype=np.float32), str(exc)
    return {"index": row["index"], "name": name, "samples": samples, "error": error}


class TranscribeWorker:
    """A Ray Data actor: one loaded model, transcribing the decoded inputs of each batch together."""

    def __init__(self, spec: WorkerSpec) -> None:
        from oasr.models.capabilities import capabilities_of
        from oasr.models.loader import from_pretrained
        from oasr.transcription.offline import OfflineTranscriber, calibration_feed

        loaded = from_pretrained(spec.model, device=spec.device, dtype=spec.dtype, quantization=spec.quantization,
                                 calibration_feed=calibration_feed)
        timed = "timestamps" in capabilities_of(type(loaded.model)).options
        self.transcriber = OfflineTranscriber(loaded, spec.timed_options if timed else spec.options, spec.config)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from oasr.types import Transcription

        names, errors = [str(n) for n in batch["name"]], [str(e) for e in batch["error"]]
        decoded = [np.asarray(s, dtype=np.float32) for s, e in zip(batch["samples"], errors) if not e]
        transcribed = iter(self.transcriber.run(decoded))
        results = []
        for name, error in zip(names, errors):
            if error:
                results.append(Transcription(source=name, text="", language=None, duration_s=0.0, error=error))
            else:  # arrays carry no file name; the result takes the one the local run gives it
                results.append(replace(next(transcribed), source=name))
        column = np.empty(len(results), dtype=object)
        column[:] = results
        return {"index": np.asarray(batch["index"]), "result": column}


def transcribe_on_ray(paths: Sequence[str | os.PathLike], spec: WorkerSpec, ray_options: RayOptions,
                      worker: type[TranscribeWorker] = TranscribeWorker) -> Iterator[tuple[int, Transcription]]:
    """Yields ``(index into paths, result)`` once per input, in the order results come back. Connects to
    ``ray_options.address``, or uses the Ray already initialised in this process, or starts a local cluster
    (shut down again at the end). ``worker`` is the actor class (a subclass can inject faults in tests)."""
    import ray

    started = _connect(ray_options)
    try:
        yield from _once_each(_stream(paths, spec, ray_options, worker), len(paths))
    finally:
        if started:
            ray.shutdown()


def _connect(ray_options: RayOptions) -> bool:
    """Initialises Ray unless it already is; True when this call started it."""
    from oasr.scale.cluster import RayClusterError, connect

    try:
        # Logical CPUs: one per actor plus at least one for decoding tasks, so actors never starve decoding.
        return connect(ray_options.address, ray_options.num_workers + 1)
    except RayClusterError as exc:
        raise RayRunError(str(exc)) from None


def _stream(paths: Sequence[str | os.PathLike], spec: WorkerSpec, ray_options: RayOptions,
            worker: type[TranscribeWorker]) -> Iterator[tuple[int, Transcription]]:
    import ray.data
    from ray.exceptions import RayError

    # Ray Data's warnings (an actor that cannot be placed, say) stay; its "execution finished" lines and its note
    # that its own bars are off (the CLI draws one) go.
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    logging.getLogger("ray.data._internal.progress").setLevel(logging.ERROR)
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False  # the CLI draws its own bar
    context.print_on_execution_start = False
    # Opened by absolute path (a worker's directory may not be ours), named as given (as the local run names it).
    items = [{"index": index, "path": os.path.abspath(path), "name": str(path)} for index, path in enumerate(paths)]
    dataset = ray.data.from_items(items, override_num_blocks=max(1, min(len(items), 256)))
    dataset = dataset.map(decode_row, num_cpus=1)
    with warnings.catch_warnings():
        # Ray 2.60 has no named parameter for an actor's restarts and retries yet, only these remote args (its
        # own defaults are unbounded, which would rerun a batch that kills every actor forever).
        warnings.simplefilter("ignore", DeprecationWarning)
        dataset = dataset.map_batches(
            worker, fn_constructor_kwargs={"spec": spec}, batch_size=spec.batch_size, batch_format="numpy",
            compute=ray.data.ActorPoolStrategy(size=ray_options.num_workers), num_cpus=1,
            num_gpus=ray_options.gpus_per_worker or None,
            max_restarts=MAX_ACTOR_RESTARTS, max_task_retries=MAX_BATCH_RETRIES,
        )
    try:
        for row in dataset.iter_rows():
            yield int(row["index"]), row["result"]
    except RayError as exc:
        raise RayRunError(f"the Ray run failed: {exc}") from None


def _once_each(results: Iterator[tuple[int, Transcription]], num_inputs: int) -> Iterator[tuple[int, Transcription]]:
    """The first result of each input (a batch rerun after its actor died may send some again); raises
    ``RayRunError`` naming how many never came back."""
    seen: set[int] = set()
    for index, result in results:
        if index not in seen:
            seen.add(index)
            yield index, result
    if len(seen) != num_inputs:
        raise RayRunError(f"{num_inputs - len(seen)} of {num_inputs} inputs came back without a result")
