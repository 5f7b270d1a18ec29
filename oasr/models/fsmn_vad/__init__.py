"""FunASR's FSMN-VAD: its network read from a FunASR folder and a speech detector around it (a model package, since it
reads checkpoints; the segment logic it follows is ``oasr.vad.fsmn_segments``)."""
