"""What the engine expects of an architecture class, per decode family.

Every architecture class (registered in ``oasr.models.ARCHITECTURES``) has:

- ``config_class`` with ``from_dict``/``to_dict``; ``from_config(config)``; ``tiny_config()``;
  ``example_inputs(config, batch_size)``: random inputs ``forward`` accepts (the registry smoke test);
- ``feature_extractor`` / ``tokenizer``: names in ``FEATURE_EXTRACTORS`` / ``TOKENIZERS``;
- ``decode_family``: one of ``DECODE_FAMILIES``; ``default_decode_strategy``: a name in ``DECODE_STRATEGIES``;
  optionally ``beam_decode_strategy``, the strategy that serves ``DecodeOptions.beam_size`` (requests for a beam
  are refused on architectures without one);
- ``tied_keys``: checkpoint keys that alias another parameter (may be empty).

Families and the model methods their strategies call:

- ``aed`` (Whisper, Canary): ``encode(features) -> hidden``; ``new_cache``/``decode`` (see ``AEDModel`` in
  ``oasr.decode.aed_greedy``). Incremental: the engine schedules one decode step per output token.
- ``ctc``: ``encode(features, lengths) -> EncoderOutput``; ``ctc_log_probs(hidden) -> [B, T, V]``.
  Finishes in the encode walk.
- ``transducer`` / ``tdt``: ``encode(features, lengths) -> EncoderOutput`` plus the predictor/joint methods the
  transducer strategies document. The label loop runs on the GPU inside the encode walk.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

DECODE_FAMILIES = ("aed", "ctc", "transducer", "tdt")


@dataclass
class EncoderOutput:
    """hidden: [B, T, D]; lengths: [B] valid frames of each row (int64, same device)."""

    hidden: torch.Tensor
    lengths: torch.Tensor
