"""Qwen2-Audio: a Whisper-geometry audio tower with average pooling and a linear projector, spliced into the
prompt of a Qwen2 language model."""
