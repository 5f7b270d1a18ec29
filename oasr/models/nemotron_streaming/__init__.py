"""Nemotron ASR streaming (cache-aware FastConformer + RNN-T), in transformers' ``NemotronAsrStreaming`` key layout."""
