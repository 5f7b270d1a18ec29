"""Nemotron 3.5 ASR (Nemotron ASR streaming's encoder, a language-prompt fusion, RNN-T), in transformers'
``Nemotron3_5Asr`` key layout."""
