"""SenseVoice-Small (FunASR): SANM encoder with query embeddings for language, event, emotion and ITN, and a CTC head."""
