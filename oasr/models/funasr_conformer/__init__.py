"""FunASR's Conformer: CTC head and Transformer attention decoder (CTC prefix beam, then attention rescoring)."""
