"""Whisper (encoder-decoder, AED) in the Hugging Face key layout."""
