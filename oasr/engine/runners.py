"""The runner registry: one model runner per runner kind (``ModelCapabilities.runner``).

A runner turns the scheduler's decisions into tensors for one kind of model: ``autoregressive`` (a decoder step
per token, paged K/V, CUDA graphs; ``oasr.engine.autoregressive``) and ``frame_sync`` (the whole decode inside
the encode walk; ``oasr.engine.frame_runner``). ``ASREngine`` looks its runner up here and never names one.

What the engine reads of a runner is the ``Runner`` protocol (``oasr.engine.contracts``), which the registry
checks each runner class against when it registers; a runner whose steps overlap also provides ``launch``
(``OverlappingRunner``, checked when the engine is built).
"""

from __future__ import annotations

from oasr.engine.contracts import Runner
from oasr.registry import Registry

RUNNERS: Registry[type] = Registry(
    "runner kind",
    lazy={
        "autoregressive": "oasr.engine.autoregressive",
        "frame_sync": "oasr.engine.frame_runner",
    },
    contract=Runner,
)
