"""A tiny random transformers ``Nemotron3DiarizationForAudioFrameClassification`` built from OASR's tiny config
(saved with ``save_pretrained`` where a test needs a checkpoint), its processor, and speaker mixtures of the
shared clips, for the diarization parity tests.

Random weights at transformers' initialisation give logits near zero, so every speaker would sit at a
probability of one half. The weights are redrawn at unit gain and the classifier's output centred and scaled on
the mixtures, so each speaker's probability crosses 0.5 many times and segments come and go.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import transformers

from oasr.models import DIARIZATION_ARCHITECTURES
from speech_data import clips

SEED, LOGIT_SCALE = 3, 3.0
# Who speaks in the mixtures: a LibriVox reader, the TIMIT sample's speaker, a LibriSpeech speaker.
SPEAKER_CLIPS = ("ps_librivox_0880", "ds_ldc93s1", "mfa_librispeech_61-70968-0000")
OVERLAP_S, SAMPLE_RATE = 0.5, 16000


def mixture(num_speakers: int) -> np.ndarray:
    """The first ``num_speakers`` speakers' clips one after the other, each starting OVERLAP_S before the one
    before it ends (so turns overlap)."""
    parts = [c.audio for c in clips(SPEAKER_CLIPS[:num_speakers])]
    overlap = int(OVERLAP_S * SAMPLE_RATE)
    total = sum(len(p) for p in parts) - overlap * (len(parts) - 1)
    out, at = np.zeros(total, dtype=np.float32), 0
    for part in parts:
        out[at : at + len(part)] += part
        at += len(part) - overlap
    return out


def processor(num_mel_bins: int) -> transformers.Nemotron3DiarizationProcessor:
    extractor = transformers.NemotronAsrStreamingFeatureExtractor(feature_size=num_mel_bins)
    return transformers.Nemotron3DiarizationProcessor(extractor)


def reference_config() -> transformers.Nemotron3DiarizationConfig:
    values = DIARIZATION_ARCHITECTURES.get("nemotron3_diarization").tiny_config().to_dict()
    for key in ("model_type", "streaming_modes", "default_streaming_mode"):
        values.pop(key)
    return transformers.Nemotron3DiarizationConfig(**values)


@torch.no_grad()
def build_reference(calibration: list[np.ndarray]) -> transformers.Nemotron3DiarizationForAudioFrameClassification:
    """The tiny model with unit-gain random weights, its classifier calibrated on ``calibration``."""
    torch.manual_seed(SEED)
    model = transformers.Nemotron3DiarizationForAudioFrameClassification(reference_config()).eval()
    for name, p in model.named_parameters():
        if p.dim() >= 2:
            p.normal_(0.0, p[0].numel() ** -0.5)
        elif "norm" in name:
            p.add_(0.1 * torch.randn_like(p))
        else:  # biases and the silence embedding
            p.normal_(0.0, 0.3)
    # The upsampler as transformers initialises it (each encoder frame repeated), slightly perturbed: speakers
    # then change at the encoder's pace, not from one 10 ms frame to the next.
    conv = model.model.upsampler.conv
    conv.weight.mul_(0.1)
    conv.weight[:, :, 1] += torch.eye(conv.in_channels).repeat(model.config.head_config.subsampling_factor, 1)
    conv.bias.mul_(0.1)
    inputs = processor(model.config.audio_config.num_mel_bins)(calibration, sampling_rate=SAMPLE_RATE)
    logits = model(**inputs).logits[inputs.attention_mask.bool()]  # [frames, speakers]
    head = model.classifier.out_proj
    head.weight.mul_(LOGIT_SCALE / logits.std(0)[:, None])
    head.bias.copy_(LOGIT_SCALE * (head.bias - logits.mean(0)) / logits.std(0))
    return model


def save_reference(model: transformers.PreTrainedModel, directory: Path) -> Path:
    """The checkpoint as transformers writes it, with its processor's files."""
    model.save_pretrained(directory)
    processor(model.config.audio_config.num_mel_bins).save_pretrained(directory)
    return directory


@torch.no_grad()
def offline_logits(model, audio: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' offline forward on one input -> (logits [1, T, S], attention mask [1, T])."""
    inputs = processor(model.config.audio_config.num_mel_bins)(audio, sampling_rate=SAMPLE_RATE)
    return model(**inputs).logits, inputs.attention_mask


@torch.no_grad()
def streaming_logits(model, audio: np.ndarray, mode: str) -> list[torch.Tensor]:
    """transformers' streaming mode, as its processor documents it: a first chunk of centred frames, later
    chunks starting at the frame cursor, the last one flagged -> each chunk's logits [1, frames, S]."""
    proc = processor(model.config.audio_config.num_mel_bins)
    proc.set_streaming_mode(mode)
    first = proc.num_samples_first_audio_chunk
    out, cache = [], None
    if len(audio) <= first:
        inputs = proc(audio, sampling_rate=SAMPLE_RATE, is_streaming=True, is_last_audio_chunk=True)
        return [model(**inputs).logits]
    inputs = proc(audio[:first], sampling_rate=SAMPLE_RATE, is_streaming=True)
    result = model(**inputs)
    out.append(result.logits)
    cache, cursor = result.speaker_cache, proc.num_mel_frames_per_step
    while True:
        start = proc.audio_chunk_start(cursor)
        end = start + proc.num_samples_per_audio_chunk
        last = end >= len(audio)
        inputs = proc(audio[start:end], sampling_rate=SAMPLE_RATE, is_streaming=True, is_first_audio_chunk=False,
                      is_last_audio_chunk=last)
        result = model(**inputs, speaker_cache=cache)
        out.append(result.logits)
        cache, cursor = result.speaker_cache, cursor + proc.num_mel_frames_per_step
        if last:
            return out


def two_speaker_case(root: Path) -> tuple[Path, Path, list[dict]]:
    """A tiny checkpoint calibrated on the two-speaker mixture, the mixture as a 16-bit wav, and transformers'
    segments of that wav (``extract_speaker_dict``, threshold 0.5: dicts of Start, End, Speaker)."""
    import soundfile as sf

    from oasr.audio import load_audio

    two = mixture(2)
    reference = build_reference([two])
    checkpoint = save_reference(reference, root / "tiny-diarization")
    wav = root / "two speakers.wav"
    sf.write(wav, two, SAMPLE_RATE, subtype="PCM_16")
    logits, mask = offline_logits(reference, load_audio(wav))  # what a reader of the file sees: 16-bit samples
    expected = processor(reference.config.audio_config.num_mel_bins).extract_speaker_dict(logits, mask,
                                                                                        threshold=0.5)[0]
    assert len({s["Speaker"] for s in expected}) > 1
    return checkpoint, wav, expected
