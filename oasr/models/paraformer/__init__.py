"""Paraformer (FunASR): SANM encoder, CIF predictor, non-autoregressive SANM decoder."""
