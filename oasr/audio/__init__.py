"""Audio input: any container, codec, rate and channel layout -> 16 kHz mono float32."""
