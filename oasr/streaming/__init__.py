"""Streaming runtimes, their per-stream state, and the policies streams share (endpointing).

``STREAMING_RUNTIMES`` maps a capability record's ``streaming`` name to the runtime that serves it: the tensors
side of a stream step (gather each stream's state from its slot, run every ready stream's chunk in one forward,
scatter the state back). The engine above it (``oasr.engine.streams``) plans steps without tensors. What a
runtime provides is the ``StreamingRuntime`` protocol (``runtime.py``), checked when a runtime registers.
"""

from __future__ import annotations

from oasr.registry import Registry
from oasr.streaming.runtime import StreamingRuntime

STREAMING_RUNTIMES: Registry[type] = Registry(
    "streaming runtime",
    lazy={"cache_aware": "oasr.streaming.cache_aware", "paraformer_chunked": "oasr.models.paraformer_streaming.runtime"},
    contract=StreamingRuntime)
