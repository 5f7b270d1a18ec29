"""OpenAI's Realtime API for transcription, ``GET /v1/realtime?intent=transcription`` (WebSocket), served by
offline models one committed turn at a time.

``protocol``: the events on the wire (GA and beta dialects); ``audio``: the input formats decoded and resampled
to 16 kHz; ``session``: the buffer, its turns and the server-VAD turn boundaries, with no engine, socket or
torch; ``vad``: the detector's probabilities of a live stream; ``connection``: one session's loop against the
serving logic; ``route``: the WebSocket endpoint and its handshake checks.
"""
