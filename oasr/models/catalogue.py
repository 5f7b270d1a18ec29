"""Short names for the common releases, each standing for one Hugging Face Hub repo.

An alias is only a spelling: ``--model large-v3`` loads exactly what ``--model openai/whisper-large-v3`` loads, and
fetches it the same way (``oasr.models.hub``). Every repo id below was looked up on the Hub when it was added, with
the kind of weights it held then: ``transformers`` (config.json + safetensors, read by the transformers converter)
or ``nemo`` (only a ``.nemo`` archive, which needs the NeMo converter). A repo with both is fetched in its
transformers form. What an entry says it serves (tasks, timestamps, streaming) is the release's, within what its
architecture serves in OASR (``oasr.models.capabilities``); a test keeps the two consistent.
"""

from __future__ import annotations

from dataclasses import dataclass

# What every --model (and a model argument) accepts, in the order resolve_source tries it.
MODEL_HELP = ("a model: a local directory or .nemo file, an alias from `oasr models` (large-v3-turbo, "
              "parakeet-tdt-0.6b-v2 ...), an embedded name (tiny.en, base), or a Hugging Face Hub id "
              "ORG/NAME[@REVISION]; only an alias or a hub id downloads, into huggingface_hub's cache "
              "(docs/models.md)")


@dataclass(frozen=True)
class CatalogueEntry:
    alias: str
    hub_id: str
    architecture: str  # an ``ARCHITECTURES`` name
    family: str  # the release family, as people call it
    parameters: str  # as published, e.g. "809M"
    languages: str  # "en", or how many (and which group)
    tasks: tuple[str, ...]  # "transcribe", "translate"
    timestamps: str  # "segment+word", or "none" where OASR gives none for this architecture
    streaming: bool  # cache-aware streaming (oasr transcribe --stream, /v1/realtime)
    weights: str  # "transformers" or "nemo", as described above

    @property
    def serves(self) -> str:
        parts = ["/".join(self.tasks)]
        if self.timestamps != "none":
            parts.append(f"{self.timestamps} timestamps")
        if self.streaming:
            parts.append("streaming")
        return "; ".join(parts)


_WHISPER = dict(architecture="whisper", family="Whisper", timestamps="segment+word", streaming=False,
                weights="transformers")
_ALL_WHISPER_LANGUAGES = "99"

CATALOGUE: dict[str, CatalogueEntry] = {
    entry.alias: entry
    for entry in (
        CatalogueEntry("large-v3", "openai/whisper-large-v3", parameters="1.55B", languages=_ALL_WHISPER_LANGUAGES,
                       tasks=("transcribe", "translate"), **_WHISPER),
        # Turbo was fine-tuned on transcription only; OpenAI advises against it for translation.
        CatalogueEntry("large-v3-turbo", "openai/whisper-large-v3-turbo", parameters="809M",
                       languages=_ALL_WHISPER_LANGUAGES, tasks=("transcribe",), **_WHISPER),
        CatalogueEntry("medium", "openai/whisper-medium", parameters="769M", languages=_ALL_WHISPER_LANGUAGES,
                       tasks=("transcribe", "translate"), **_WHISPER),
        CatalogueEntry("small", "openai/whisper-small", parameters="244M", languages=_ALL_WHISPER_LANGUAGES,
                       tasks=("transcribe", "translate"), **_WHISPER),
        CatalogueEntry("distil-large-v3", "distil-whisper/distil-large-v3", parameters="756M", languages="en",
                       tasks=("transcribe",), **_WHISPER),
        CatalogueEntry("parakeet-tdt-0.6b-v2", "nvidia/parakeet-tdt-0.6b-v2", architecture="parakeet_tdt",
                       family="Parakeet", parameters="600M", languages="en", tasks=("transcribe",),
                       timestamps="none", streaming=False, weights="nemo"),
        CatalogueEntry("parakeet-ctc-1.1b", "nvidia/parakeet-ctc-1.1b", architecture="parakeet_ctc",
                       family="Parakeet", parameters="1.1B", languages="en", tasks=("transcribe",),
                       timestamps="none", streaming=False, weights="transformers"),
        CatalogueEntry("canary-1b-v2", "nvidia/canary-1b-v2", architecture="canary", family="Canary",
                       parameters="978M", languages="25 European", tasks=("transcribe", "translate"),
                       timestamps="none", streaming=False, weights="transformers"),
        CatalogueEntry("nemotron-speech-streaming-en-0.6b", "nvidia/nemotron-speech-streaming-en-0.6b",
                       architecture="nemotron_asr_streaming", family="Nemotron Speech", parameters="600M",
                       languages="en", tasks=("transcribe",), timestamps="none", streaming=True,
                       weights="transformers"),
        CatalogueEntry("nemotron-3.5-asr-streaming-0.6b", "nvidia/nemotron-3.5-asr-streaming-0.6b",
                       architecture="nemotron3_5_asr", family="Nemotron 3.5 ASR", parameters="600M",
                       languages="multilingual", tasks=("transcribe",), timestamps="none", streaming=True,
                       weights="transformers"),
        # The "-hf" repo is the transformers layout; Qwen/Qwen3-ASR-1.7B is the qwen-asr package's own.
        CatalogueEntry("qwen3-asr-1.7b", "Qwen/Qwen3-ASR-1.7B-hf", architecture="qwen3_asr", family="Qwen3-ASR",
                       parameters="1.7B", languages="30 (+22 Chinese dialects)", tasks=("transcribe",),
                       timestamps="none", streaming=False, weights="transformers"),
        # Gated: accept its terms on the Hub and set HF_TOKEN.
        CatalogueEntry("cohere-transcribe", "CohereLabs/cohere-transcribe-03-2026", architecture="cohere_asr",
                       family="Cohere Transcribe", parameters="2B", languages="14", tasks=("transcribe",),
                       timestamps="none", streaming=False, weights="transformers"),
    )
}
