"""Decode-strategy registry. A strategy declares what it consumes and whether it runs token by token:

- ``consumes``: ``"encoder_hidden_states"`` (attention decoders, transducers) or ``"log_probs"`` (CTC heads);
- ``incremental``: True when it needs one model step per output token (the engine then schedules decode steps).
"""

from __future__ import annotations

from oasr.registry import Registry

DECODE_STRATEGIES: Registry[type] = Registry(
    "decode strategy",
    lazy={
        "aed_beam": "oasr.decode.aed_beam",
        "aed_greedy": "oasr.decode.aed_greedy",
        "ctc_greedy": "oasr.decode.ctc_greedy",
        "ctc_prefix_beam": "oasr.decode.ctc_prefix_beam",
        "transducer_greedy": "oasr.decode.transducer_greedy",
        "tdt_greedy": "oasr.decode.transducer_greedy",
    },
)

__all__ = ["DECODE_STRATEGIES"]
