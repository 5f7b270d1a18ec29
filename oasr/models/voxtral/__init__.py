"""Voxtral: Whisper's encoder over 30 s windows, four frames stacked per position and projected, spliced into the
prompt of a Mistral (Llama-layout) language model."""
