"""Qwen3-ASR: an audio encoder whose output is spliced into the prompt of a Qwen3 language model."""
