"""SeACo-Paraformer (FunASR): Paraformer with per-request hotwords through a bias encoder and a "seaco" decoder."""
