"""Benchmarking and accuracy: WER, RTFx, latency, peers run side by side."""
