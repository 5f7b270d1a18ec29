"""Server-Sent Events as OpenAI sends them: ``data: <json>`` blocks, no ``event:`` lines."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable

from pydantic import BaseModel
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send


def sse_data(payload: BaseModel | dict) -> str:
    data = payload.model_dump() if isinstance(payload, BaseModel) else payload
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


class SSEResponse(StreamingResponse):
    """A stream whose ``on_close`` runs however it ends: finished, client gone (Starlette cancels the body
    iterator), or failed before the first byte (when the iterator never even starts, so its own ``finally``
    would never run). ``on_close`` is where engine requests are aborted and the admission released."""

    def __init__(self, events: AsyncIterator[str], on_close: Callable[[], None]) -> None:
        super().__init__(events, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()
