"""Hugging Face ``transformers`` checkpoints: ``config.json`` (``model_type``) + safetensors or a torch pickle.

Architectures are stored in the Hugging Face key layout already, so loading is a lookup; the only work is
reading ``generation_config.json`` for the checkpoint's decoding defaults.
"""

from __future__ import annotations

import json

from oasr.errors import CheckpointError
from oasr.models import CONVERTERS
from oasr.models.checkpoint import Checkpoint, ModelSource, require_file
from oasr.models.converters.safetensors_io import find_weights, load_state_dict

# transformers' model_type -> OASR architecture.
_MODEL_TYPES = {
    "whisper": "whisper",
    "parakeet_ctc": "parakeet_ctc",
    "parakeet_rnnt": "parakeet_rnnt",
    "parakeet_tdt": "parakeet_tdt",
}
_GENERATION_KEYS = ("suppress_tokens", "begin_suppress_tokens", "alignment_heads")


@CONVERTERS.register("huggingface")
class HuggingFaceConverter:
    @staticmethod
    def detect(source: ModelSource) -> bool:
        config = source.directory / "config.json"
        if not config.is_file() or not find_weights(source.directory):
            return False
        try:
            return "model_type" in json.loads(config.read_text())
        except json.JSONDecodeError:
            return False

    @staticmethod
    def load(source: ModelSource) -> Checkpoint:
        config = json.loads(require_file(source.directory / "config.json").read_text())
        model_type = config.get("model_type")
        if model_type not in _MODEL_TYPES:
            raise CheckpointError(f"{source}: model_type {model_type!r} is not supported; known: {', '.join(_MODEL_TYPES)}")
        generation_file = source.directory / "generation_config.json"
        if generation_file.is_file():
            generation = json.loads(generation_file.read_text())
            config.update({k: generation[k] for k in _GENERATION_KEYS if generation.get(k) is not None})
        return Checkpoint(
            architecture=_MODEL_TYPES[model_type],
            config=config,
            state_dict=load_state_dict(find_weights(source.directory)),
            tokenizer_file=require_file(source.directory / "tokenizer.json"),
            format="huggingface",
        )
