"""The drivers above the engine: cutting inputs into windows, long-form decoding, segments, word timing.

The engine (``oasr.engine``) takes one window of audio per request and returns tokens; everything that turns
whole inputs into ``Transcription`` results lives here, and reaches model specifics only through the model's
declared capabilities.
"""
