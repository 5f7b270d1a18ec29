"""Tokenizer registry: checkpoint vocabularies -> encode/decode with special tokens resolved by name."""

from __future__ import annotations

from oasr.registry import Registry

TOKENIZERS: Registry[type] = Registry(
    "tokenizer",
    lazy={
        "whisper_hf_json": "oasr.tokenizers.whisper",
        "parakeet_hf_json": "oasr.tokenizers.parakeet",
        "hf_json": "oasr.tokenizers.hf_json",
        "qwen3_asr_json": "oasr.tokenizers.qwen3_asr",
        "sentencepiece": "oasr.tokenizers.sentencepiece",
        "funasr_tokens": "oasr.tokenizers.funasr_tokens",
        "funasr_tokens_timed": "oasr.tokenizers.funasr_tokens",
        "sense_voice_bpe": "oasr.tokenizers.sense_voice",
        "tekken": "oasr.tokenizers.tekken",
    },
)

__all__ = ["TOKENIZERS"]
