"""FunASR's online Paraformer (``ParaformerStreaming``): the SANM encoder run chunk by chunk over a look-back
cache, CIF carried across chunks, the SANM decoder with its FSMN and cross-attention caches."""
