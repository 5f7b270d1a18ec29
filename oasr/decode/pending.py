"""Token ids a decode strategy has asked the device for but not yet read back.

A frame-synchronous step ends with a device-to-host copy of its tokens, and reading them makes the host wait for
the device. ``launch`` returns at once with the copy queued; ``wait`` reads it. Between the two the engine
prepares and queues its next step, so the device never idles while the host does its bookkeeping.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from oasr.decode.base import EncoderOutput


class PendingTokens(Protocol):
    def wait(self) -> list[list[int]]: ...


class ReadyTokens:
    """Tokens already on the host."""

    def __init__(self, tokens: list[list[int]]) -> None:
        self.tokens = tokens

    def wait(self) -> list[list[int]]:
        return self.tokens


class CopiedTokens:
    """Tensors on their way to pinned host memory; ``wait`` waits for the copies, then ``finish`` turns the host
    tensors into token ids."""

    def __init__(self, tensors: tuple[torch.Tensor, ...], finish: Callable[..., list[list[int]]]) -> None:
        self._finish = finish
        if tensors[0].is_cuda:
            self._host = tuple(torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t, non_blocking=True)
                               for t in tensors)
            self._copied: torch.cuda.Event | None = torch.cuda.Event()
            self._copied.record()
        else:
            self._host, self._copied = tuple(t.cpu() for t in tensors), None

    def wait(self) -> list[list[int]]:
        if self._copied is not None:
            self._copied.synchronize()
        return self._finish(*self._host)


class LaunchesEagerly:
    """For strategies that read the device as they go (a label loop checks when every row is done): ``launch``
    decodes at once and hands back tokens that are ready."""

    def launch(self, model, encoder_output: EncoderOutput) -> PendingTokens:
        return ReadyTokens(self.decode(model, encoder_output))  # type: ignore[attr-defined]
