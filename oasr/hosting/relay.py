"""What a client of an engine (in a thread or a process of its own) needs on its event loop: the errors it
may raise and the two helpers that hand results over. Torch-free, so the server's API processes stay light."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from oasr.engine.request import RequestOutput
from oasr.errors import OASRError


class EngineOverloadedError(OASRError):
    """The waiting queue is full: the caller should retry later."""


class EngineDeadError(OASRError):
    """The engine loop stopped after an internal error; no request can be served."""


class ReplicaLostError(OASRError):
    """One engine replica of several (``oasr serve --ray-replicas``) stopped, or none is up just now: this request
    failed, while the server stays up and a retry may be served by another replica."""


async def relay(outputs: asyncio.Queue) -> AsyncIterator[RequestOutput]:
    """A request's outputs as the engine queues them, up to and including the finished one; an exception the
    engine queued instead is raised."""
    while True:
        item = await outputs.get()
        if isinstance(item, BaseException):
            raise item
        yield item
        if item.finished:
            return


def settle(future: asyncio.Future, value: object) -> None:
    """Completes ``future`` with ``value``, raised if it is an exception; one already done (its caller gave up:
    timed out, client gone) is left alone. Called on the future's event loop."""
    if future.done():
        return
    if isinstance(value, BaseException):
        future.set_exception(value)
    else:
        future.set_result(value)
