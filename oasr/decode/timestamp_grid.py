"""Whisper's timestamp tokens as times: one token per encoder position of a 30 s window. Torch-free, so the
server's API processes turn tokens into segment times without it."""

CHUNK_SECONDS = 30.0
NUM_AUDIO_POSITIONS = 1500  # encoder positions per window
SECONDS_PER_TIMESTAMP = CHUNK_SECONDS / NUM_AUDIO_POSITIONS  # 0.02 s
