"""The log-mel frontend of Canary and Cohere Transcribe: NeMo's (``nemo_logmel``) with the checkpoint's own
settings from ``preprocessor_config.json`` (``FrontendSettings``), plus Cohere's inference-time dither.

transformers' ``CohereAsrFeatureExtractor`` adds ``dither`` x N(0, 1) noise to each input's real samples before
pre-emphasis, drawn from a CPU generator seeded with that input's sample count, so the same audio always gets the
same noise. It is drawn the same way here, whatever device the features are computed on: the reference's features
of digital silence depend on it. Canary's extractor (``ParakeetFeatureExtractor``) has no dither.
"""

from __future__ import annotations

import torch

from oasr.features import FEATURE_EXTRACTORS
from oasr.features.nemo_logmel import NemoLogMel, NemoLogMelConfig


@FEATURE_EXTRACTORS.register("aed_logmel")
class AEDLogMel(NemoLogMel):
    def __init__(self, config: NemoLogMelConfig | None = None, *, dither: float = 0.0) -> None:
        super().__init__(config)
        if dither < 0:
            raise ValueError(f"dither must be >= 0, got {dither}")
        self.dither = dither

    @classmethod
    def for_model(cls, config: object) -> AEDLogMel:
        """The extractor of a Canary / Cohere config (its ``preprocessor`` settings)."""
        settings = config.preprocessor  # type: ignore[attr-defined]
        frontend = NemoLogMelConfig(
            num_mel_bins=settings.feature_size,
            sample_rate=settings.sampling_rate,
            n_fft=settings.n_fft,
            win_length=settings.win_length,
            hop_length=settings.hop_length,
            preemphasis=settings.preemphasis,
        )
        return cls(frontend, dither=settings.dither)

    def log_mel(self, waveforms: torch.Tensor, num_samples: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.dither > 0:
            noise = self.seeded_noise(num_samples, waveforms.shape[1]).to(waveforms.device)
            waveforms = waveforms + self.dither * noise
        return super().log_mel(waveforms, num_samples)

    @staticmethod
    def seeded_noise(num_samples: torch.Tensor, width: int) -> torch.Tensor:
        """[B, width] float32 on the CPU: N(0, 1) on each row's first ``num_samples[b]`` samples, seeded with that
        count (as the reference seeds it), zero past them."""
        noise = torch.zeros(len(num_samples), width)
        generator = torch.Generator()
        for row, count in enumerate(num_samples.tolist()):
            count = min(int(count), width)
            if count > 0:
                generator.manual_seed(count)
                noise[row, :count] = torch.randn(count, generator=generator)
        return noise
