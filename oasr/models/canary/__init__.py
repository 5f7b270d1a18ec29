"""Canary and Cohere Transcribe: a FastConformer encoder with a transformer decoder."""
