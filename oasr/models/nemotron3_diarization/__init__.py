"""Nemotron 3 Diarization (transformers' ``Nemotron3DiarizationForAudioFrameClassification``): who speaks when."""
