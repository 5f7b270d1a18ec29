"""The runner registry: one model runner per runner kind (``ModelCapabilities.runner``).

A runner turns the scheduler's decisions into tensors for one kind of model: ``autoregressive`` (a decoder step
per token, paged K/V, CUDA graphs; ``oasr.engine.autoregressive``) and ``frame_sync`` (the whole decode inside
the encode walk; ``oasr.engine.frame_runner``). ``ASREngine`` looks its runner up here and never names one.

What the engine reads of a runner: ``incremental``, ``overlaps_steps``, ``pads_to_window``, ``num_slots``,
``max_positions``, ``window_samples``, ``end_token`` (-1: none), ``stop_tokens`` (more tokens that end a request),
``block_pool`` / ``cross_pool`` (the scheduler's self- and cross-attention block pools, or None),
``check(options)``, ``prompt_len_for(options, num_samples)``, ``num_frames(num_samples)``,
``cross_positions(num_samples)``, ``output_language(language, token_ids)`` (the language a finished request is
reported in), ``execute(out, requests)`` and, where steps overlap, ``launch(out, requests)``.
"""

from __future__ import annotations

from oasr.registry import Registry

RUNNERS: Registry[type] = Registry(
    "runner kind",
    lazy={
        "autoregressive": "oasr.engine.autoregressive",
        "frame_sync": "oasr.engine.frame_runner",
    },
)
