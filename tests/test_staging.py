"""The audio stager: what it pins ahead of an encode step, within its caps, and what a step takes from it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import oasr.engine.staging as staging
from oasr.engine.request import Request, RequestStatus
from oasr.engine.staging import AudioStager
from oasr.types import DecodeOptions


@pytest.fixture(autouse=True)
def copies_instead_of_pinning(monkeypatch):
    """This CPU has no pinned memory: a plain copy stands in, so tests can tell a staged tensor from the audio."""
    monkeypatch.setattr(staging, "_pinned", lambda audio: torch.from_numpy(np.array(audio, dtype=np.float32)))


def request(name: str, samples: int, status: RequestStatus = RequestStatus.WAITING) -> Request:
    audio = np.full(samples, float(len(name)), dtype=np.float32)
    return Request(request_id=name, audio=audio, options=DecodeOptions(), status=status)


def test_waiting_requests_are_staged_in_order_within_the_caps() -> None:
    stager = AudioStager(max_requests=3, max_bytes=4 * 100)
    running = request("running", 10, RequestStatus.RUNNING)
    queue = [running, request("a", 30), request("b", 40), request("c", 40)]
    stager.prefetch(queue)
    # The running request is skipped; "c" would take the bytes past 400 (30 + 40 + 40 samples of 4 bytes).
    assert list(stager._staged) == ["a", "b"]
    queue[1].status = RequestStatus.RUNNING  # admitted to an encode step, as the scheduler marks it
    staged = stager.take(queue[1])
    assert isinstance(staged, torch.Tensor) and torch.equal(staged, torch.from_numpy(queue[1].audio))
    assert stager.take(queue[1]) is queue[1].audio  # taken once; a second take is the request's own audio
    assert stager.take(queue[3]) is queue[3].audio  # never staged
    stager.prefetch(queue)  # room again: "c" now fits
    assert list(stager._staged) == ["b", "c"]
    stager.close()


def test_the_request_cap_and_aborted_requests() -> None:
    stager = AudioStager(max_requests=2, max_bytes=1 << 20)
    queue = [request(name, 8) for name in "abc"]
    stager.prefetch(queue)
    assert list(stager._staged) == ["a", "b"]
    stager.retain({"b", "c"})  # "a" was aborted
    queue[0].status = RequestStatus.ABORTED
    assert list(stager._staged) == ["b"] and stager._bytes == 32
    stager.prefetch(queue)
    assert list(stager._staged) == ["b", "c"]
    stager.close()
    assert not stager._staged and stager._bytes == 0


def test_a_failed_copy_falls_back_to_the_requests_own_audio(monkeypatch) -> None:
    def no_pinned_memory(audio):
        raise RuntimeError("out of pinned memory")

    monkeypatch.setattr(staging, "_pinned", no_pinned_memory)
    stager = AudioStager(max_requests=2, max_bytes=1 << 20)
    queue = [request("a", 8)]
    stager.prefetch(queue)
    queue[0].status = RequestStatus.RUNNING
    assert stager.take(queue[0]) is queue[0].audio
    assert stager._bytes == 0
    stager.close()
