"""Granite Speech: a conformer encoder, a windowed Q-Former projector and a Granite language model whose prompt
carries the projected audio."""
