"""Audio input: any container, codec, rate and channel layout -> 16 kHz mono float32."""

from __future__ import annotations

from oasr.audio.decode import SAMPLE_RATE, AudioSource, audio_duration, load_audio

__all__ = ["SAMPLE_RATE", "AudioSource", "audio_duration", "load_audio"]
