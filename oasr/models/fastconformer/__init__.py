"""FastConformer (Parakeet / Nemotron) with CTC, RNN-T and TDT heads, in the Hugging Face Parakeet key layout."""
