"""Pins queued requests' audio on a background thread while the device works.

Uploading a batch of audio means copying every sample into pinned host memory first (the device can only read
pinned memory asynchronously), and for a batch of long clips that copy is tens of milliseconds of host time with
the device idle. A runner whose steps cannot overlap (the encoder-decoder one: each step's tokens feed the next)
hands this stager the requests that wait to be encoded while its current step runs on the device; a worker thread copies their audio into pinned tensors, and the next step uploads them straight
from there, one asynchronous copy per row. Torch releases the GIL for the copies, so the worker runs while the
main thread waits on the device.
"""

from __future__ import annotations

import logging
from collections.abc import Container, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch

from oasr.engine.request import Request, RequestStatus

log = logging.getLogger(__name__)

# Pinned host memory a stager may hold for waiting requests' audio (512 MiB is over two hours of audio).
STAGED_BYTES = 512 << 20


def _pinned(audio: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(audio, dtype=np.float32)).pin_memory()


class AudioStager:
    """Pinned copies of waiting requests' audio, made ahead of their encode step.

    At most ``max_requests`` requests and ``max_bytes`` of audio are staged at a time; a request that was not
    staged is simply uploaded the ordinary way.
    """

    def __init__(self, max_requests: int, max_bytes: int) -> None:
        self.max_requests = max_requests
        self.max_bytes = max_bytes
        self._staged: dict[str, tuple[Future[torch.Tensor], int]] = {}
        self._bytes = 0
        self._worker: ThreadPoolExecutor | None = None  # started on first use

    def prefetch(self, requests: Iterable[Request]) -> None:
        """Starts pinning the audio of ``requests`` that wait to be encoded, in their order, up to the caps."""
        for request in requests:
            if len(self._staged) >= self.max_requests:
                return
            if request.status is not RequestStatus.WAITING or request.features is not None:
                continue
            if request.request_id in self._staged:
                continue
            size = request.audio.nbytes
            if self._bytes + size > self.max_bytes:
                return
            if self._worker is None:
                self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="oasr-stage")
            self._staged[request.request_id] = (self._worker.submit(_pinned, request.audio), size)
            self._bytes += size

    def stage(self, requests: Mapping[str, Request]) -> None:
        """A step's hook, given the engine's live requests: forget the departed, start on the waiting."""
        self.retain(requests)
        self.prefetch(requests.values())

    def take(self, request: Request) -> np.ndarray | torch.Tensor:
        """The request's audio: its pinned copy when one was staged (waiting for it if still in progress)."""
        entry = self._staged.pop(request.request_id, None)
        if entry is None:
            return request.audio
        future, size = entry
        self._bytes -= size
        try:
            return future.result()
        except Exception as error:  # no pinned memory to be had, say: the ordinary upload still works
            log.warning("staging the audio of %s failed (%s); uploading it unstaged", request.request_id, error)
            return request.audio

    def retain(self, live: Container[str]) -> None:
        """Drops the copies of requests no longer in ``live`` (aborted before their encode step)."""
        for request_id in [r for r in self._staged if r not in live]:
            future, size = self._staged.pop(request_id)
            future.cancel()
            self._bytes -= size

    def close(self) -> None:
        if self._worker is not None:
            self._worker.shutdown(wait=False, cancel_futures=True)
        self._staged.clear()
        self._bytes = 0


def stager_for(device: torch.device, max_requests: int) -> AudioStager | None:
    """A stager for a runner on ``device``: only CUDA uploads from pinned memory; elsewhere None."""
    return AudioStager(max_requests, STAGED_BYTES) if device.type == "cuda" else None
