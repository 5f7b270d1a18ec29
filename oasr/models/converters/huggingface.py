"""Hugging Face ``transformers`` checkpoints: ``config.json`` (``model_type``) + safetensors or a torch pickle.

Architectures are stored in the Hugging Face key layout already, so loading is a lookup plus the few renames
in ``_RENAMES``; the other work is reading ``generation_config.json`` for the checkpoint's decoding defaults and,
for the encoder-decoders with NeMo's frontend, ``preprocessor_config.json`` for their feature settings.
"""

from __future__ import annotations

import json
import re

import torch

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
    "nemotron_asr_streaming": "nemotron_asr_streaming",
    "nemotron3_5_asr": "nemotron3_5_asr",
    "canary": "canary",
    "cohere_asr": "cohere_asr",
    "qwen3_asr": "qwen3_asr",
    "voxtral": "voxtral",
    "qwen2_audio": "qwen2_audio",
    "granite_speech": "granite_speech",
}
_GENERATION_KEYS = ("suppress_tokens", "begin_suppress_tokens", "alignment_heads")

# Every key rename, per model_type: (pattern, replacement), applied in order to each checkpoint key (a later rule
# sees what an earlier one wrote). Each rule leaves keys already in the target layout unchanged.
Renames = tuple[tuple[str, str], ...]
# Canary / Cohere decoder attention calls its output projection ``o_proj``; the waist's attention ``out_proj``.
_DECODER_ATTENTION_OUT: Renames = (
    (r"^(model\.decoder\.layers\.\d+\.(?:self_attn|encoder_attn))\.o_proj\.", r"\1.out_proj."),
)
# Cohere Transcribe's published checkpoint keeps NeMo's names, which transformers renames as it loads
# (``transformers.conversion_mapping``, entry "cohere_asr"); the same renames, to transformers' layout.
_COHERE_NEMO_NAMES: Renames = (
    (r"encoder\.pre_encode\.conv\.", r"encoder.subsampling.layers."),
    (r"encoder\.pre_encode\.out\.", r"encoder.subsampling.linear."),
    (r"transf_decoder\._embedding\.position_embedding\.pos_enc", r"decoder.pos_emb.weight"),
    (r"transf_decoder\._embedding\.token_embedding", r"decoder.embed_tokens"),
    (r"transf_decoder\._embedding\.layer_norm", r"decoder.embedding_layernorm"),
    (r"transf_decoder\._decoder\.final_layer_norm", r"decoder.norm"),
    (r"transf_decoder\._decoder\.layers", r"decoder.layers"),
    (r"encoder_decoder_proj\.", r"decoder.proj."),
    (r"encoder\.(.+)\.self_attn\.linear_q", r"encoder.\1.self_attn.q_proj"),
    (r"encoder\.(.+)\.self_attn\.linear_k", r"encoder.\1.self_attn.k_proj"),
    (r"encoder\.(.+)\.self_attn\.linear_v", r"encoder.\1.self_attn.v_proj"),
    (r"encoder\.(.+)\.self_attn\.linear_out", r"encoder.\1.self_attn.o_proj"),
    (r"encoder\.(.+)\.self_attn\.linear_pos", r"encoder.\1.self_attn.relative_k_proj"),
    (r"encoder\.(.+)\.self_attn\.pos_bias_u", r"encoder.\1.self_attn.bias_u"),
    (r"encoder\.(.+)\.self_attn\.pos_bias_v", r"encoder.\1.self_attn.bias_v"),
    (r"decoder\.(.+)\.first_sub_layer\.query_net", r"decoder.\1.self_attn.q_proj"),
    (r"decoder\.(.+)\.first_sub_layer\.key_net", r"decoder.\1.self_attn.k_proj"),
    (r"decoder\.(.+)\.first_sub_layer\.value_net", r"decoder.\1.self_attn.v_proj"),
    (r"decoder\.(.+)\.first_sub_layer\.out_projection", r"decoder.\1.self_attn.o_proj"),
    (r"\.second_sub_layer\.query_net", r".encoder_attn.q_proj"),
    (r"\.second_sub_layer\.key_net", r".encoder_attn.k_proj"),
    (r"\.second_sub_layer\.value_net", r".encoder_attn.v_proj"),
    (r"\.second_sub_layer\.out_projection", r".encoder_attn.o_proj"),
    (r"\.third_sub_layer\.dense_in", r".mlp.fc1"),
    (r"\.third_sub_layer\.dense_out", r".mlp.fc2"),
    (r"\.layer_norm_1\.", r".input_layernorm."),
    (r"\.layer_norm_2\.", r".post_attention_layernorm."),
    (r"\.layer_norm_3\.", r".final_layernorm."),
    (r"\.conv\.batch_norm", r".conv.norm"),
    (r"log_softmax\.mlp\.layer0", r"proj_out"),
)


def _speech_llm_layouts(towers: str) -> Renames:
    """The speech LLMs mirror their released checkpoints (``language_model.model.*``, ``language_model.lm_head``,
    the audio ``towers`` at the top). Some transformers releases save the same weights under their in-memory module
    paths instead: 5.25 with ``save_original_format=False`` writes ``model.language_model.*``, ``model.<tower>.*``
    and ``lm_head``; 5.17 (on the H200) wrote Voxtral's language model one ``model.`` too deep,
    ``language_model.model.model.*``, beside ``language_model.lm_head``; a checkpoint may also carry the language
    model's layers straight under ``language_model.`` beside a top-level ``lm_head``. Any of them loads."""
    return (
        (r"^language_model\.model\.model\.", "language_model.model."),
        (r"^model\.language_model\.", "language_model.model."),
        (rf"^model\.({towers})\.", r"\1."),
        (r"^lm_head\.", "language_model.lm_head."),
        (r"^language_model\.(?!model\.|lm_head\.)", "language_model.model."),
    )


_RENAMES: dict[str, Renames] = {
    "canary": _DECODER_ATTENTION_OUT,
    "cohere_asr": _COHERE_NEMO_NAMES + _DECODER_ATTENTION_OUT,
    "voxtral": _speech_llm_layouts("audio_tower|multi_modal_projector"),
    "qwen2_audio": _speech_llm_layouts("audio_tower|multi_modal_projector"),
    "granite_speech": _speech_llm_layouts("encoder|projector"),
}
# Keys some checkpoints carry that no module takes: NeMo's featurizer buffers (its mel filters and window),
# which the feature extractor computes itself.
_DROPPED = re.compile(r"^preprocessor\.featurizer\.")
# preprocessor_config.json, merged into the config under "preprocessor" for architectures whose frontend reads it.
_PREPROCESSOR_TYPES = ("canary", "cohere_asr")
# processor_config.json fields that belong to the model's config, per model_type: Nemotron 3.5's processor holds
# the language -> prompt index table its model is conditioned with.
_PROCESSOR_KEYS = {"nemotron3_5_asr": ("prompt_dictionary",)}


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
        preprocessor_file = source.directory / "preprocessor_config.json"
        if model_type in _PREPROCESSOR_TYPES and preprocessor_file.is_file():
            config["preprocessor"] = json.loads(preprocessor_file.read_text())
        processor_file = source.directory / "processor_config.json"
        if model_type in _PROCESSOR_KEYS and processor_file.is_file():
            processor = json.loads(processor_file.read_text())
            config.update({k: processor[k] for k in _PROCESSOR_KEYS[model_type] if k in processor})
        state_dict, dropped = rename_keys(model_type, load_state_dict(find_weights(source.directory)))
        return Checkpoint(
            architecture=_MODEL_TYPES[model_type],
            config=config,
            state_dict=state_dict,
            tokenizer_file=require_file(source.directory / tokenizer_file_of(source.directory)),
            format="huggingface",
            dropped_keys=dropped,
        )


def tokenizer_file_of(directory) -> str:
    """The vocabulary's file name: ``tokenizer.json``, or Mistral's ``tekken.json`` (Voxtral) where that is all
    the checkpoint has."""
    return "tekken.json" if not (directory / "tokenizer.json").is_file() and (directory / "tekken.json").is_file() \
        else "tokenizer.json"


def rename_keys(model_type: str, state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], list[str]]:
    """The checkpoint's keys in the architecture's layout (``_RENAMES``), and the keys dropped (``_DROPPED``)."""
    renames = [(re.compile(pattern), replacement) for pattern, replacement in _RENAMES.get(model_type, ())]
    if not renames:
        return state, []
    renamed: dict[str, torch.Tensor] = {}
    dropped: list[str] = []
    for key, tensor in state.items():
        if _DROPPED.match(key):
            dropped.append(key)
            continue
        for pattern, replacement in renames:
            key = pattern.sub(replacement, key)
        renamed[key] = tensor
    return renamed, dropped
