"""Decode-strategy registry. Every strategy declares, as class attributes:

- ``runner``: the runner kind that drives it (``"autoregressive"``: the engine schedules a decoder step per token
  and the strategy picks each token; ``"frame_sync"``: it decodes a whole batch inside the encode walk);
- ``searches``: whether it serves ``DecodeOptions.beam_size`` (an architecture's first searching strategy does).

Architectures list the strategies they serve in their ``ModelCapabilities``; ``tests/test_registries.py`` fails
when a registered strategy is reachable from no architecture.
"""

from __future__ import annotations

from oasr.registry import Registry

DECODE_STRATEGIES: Registry[type] = Registry(
    "decode strategy",
    lazy={
        "aed_beam": "oasr.decode.aed_beam",
        "aed_greedy": "oasr.decode.aed_greedy",
        "ctc_attention_rescore": "oasr.decode.attention_rescoring",
        "cif_greedy": "oasr.decode.cif_greedy",
        "cif_hotwords": "oasr.decode.cif_hotwords",
        "ctc_greedy": "oasr.decode.ctc_greedy",
        "ctc_prefix_beam": "oasr.decode.ctc_prefix_beam",
        "ctc_wfst": "oasr.decode.ctc_wfst",
        "hf_beam": "oasr.decode.hf_beam",
        "transducer_beam": "oasr.decode.transducer_beam",
        "transducer_greedy": "oasr.decode.transducer_greedy",
        "tdt_greedy": "oasr.decode.transducer_greedy",
        "tdt_beam": "oasr.decode.tdt_beam",
    },
)

__all__ = ["DECODE_STRATEGIES"]
