"""On a CUDA device: half-precision decoding agrees with the fp32 CPU reference on nearly every clip."""

from __future__ import annotations

import pytest

from oasr.api import transcribe
from oasr.audio import load_audio
from oasr.models.loader import from_pretrained
from speech_data import audio_path, english_short, require_speech_data

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def english_audio():
    require_speech_data()
    entries = english_short()
    return entries, [load_audio(audio_path(e), channel=e.get("channel")) for e in entries]


@pytest.fixture(scope="module")
def cpu_tokens(tiny_en, english_audio):
    _, audio = english_audio
    return [r.token_ids for r in transcribe(audio, tiny_en, batch_size=16)]


@pytest.mark.parametrize("dtype,min_agreement", [("float32", 1.0), ("float16", 0.95), ("bfloat16", 0.85)])
def test_cuda_tokens_agree_with_fp32_cpu(english_audio, cpu_tokens, dtype: str, min_agreement: float) -> None:
    entries, audio = english_audio
    loaded = from_pretrained("tiny.en", device="cuda", dtype=dtype)
    results = transcribe(audio, loaded, batch_size=64)
    differing = [
        (e["id"], loaded.tokenizer.decode(cpu), r.text)
        for e, cpu, r in zip(entries, cpu_tokens, results, strict=True)
        if r.token_ids != cpu
    ]
    agreement = 1 - len(differing) / len(entries)
    print(f"\n{dtype} on CUDA: {len(entries) - len(differing)}/{len(entries)} clips token-identical to fp32 CPU")
    for clip_id, cpu_text, gpu_text in differing:
        print(f"  {clip_id}\n    cpu : {cpu_text.strip()}\n    cuda: {gpu_text}")
    assert agreement >= min_agreement
