"""openai-whisper's ``Whisper`` built from an OASR checkpoint (Hugging Face key layout): the reference for
timestamp decoding, long-form transcription, language detection and word timestamps."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import torch

SAMPLE_RATE = 16_000
HOP_LENGTH = 160
N_SAMPLES_OF_WINDOW = 30 * SAMPLE_RATE

# OASR (Hugging Face) key pattern -> openai-whisper key template.
_KEYS = [
    (r"model\.encoder\.conv(\d)\.(weight|bias)", "encoder.conv{0}.{1}"),
    (r"model\.encoder\.embed_positions\.weight", "encoder.positional_embedding"),
    (r"model\.encoder\.layer_norm\.(weight|bias)", "encoder.ln_post.{0}"),
    (r"model\.decoder\.embed_tokens\.weight", "decoder.token_embedding.weight"),
    (r"model\.decoder\.embed_positions\.weight", "decoder.positional_embedding"),
    (r"model\.decoder\.layer_norm\.(weight|bias)", "decoder.ln.{0}"),
    (r"model\.(encoder|decoder)\.layers\.(\d+)\.self_attn\.q_proj\.(weight|bias)", "{0}.blocks.{1}.attn.query.{2}"),
    (r"model\.(encoder|decoder)\.layers\.(\d+)\.self_attn\.k_proj\.(weight|bias)", "{0}.blocks.{1}.attn.key.{2}"),
    (r"model\.(encoder|decoder)\.layers\.(\d+)\.self_attn\.v_proj\.(weight|bias)", "{0}.blocks.{1}.attn.value.{2}"),
    (r"model\.(encoder|decoder)\.layers\.(\d+)\.self_attn\.out_proj\.(weight|bias)", "{0}.blocks.{1}.attn.out.{2}"),
    (r"model\.(encoder|decoder)\.layers\.(\d+)\.self_attn_layer_norm\.(weight|bias)", "{0}.blocks.{1}.attn_ln.{2}"),
    (r"model\.decoder\.layers\.(\d+)\.encoder_attn\.q_proj\.(weight|bias)", "decoder.blocks.{0}.cross_attn.query.{1}"),
    (r"model\.decoder\.layers\.(\d+)\.encoder_attn\.k_proj\.(weight|bias)", "decoder.blocks.{0}.cross_attn.key.{1}"),
    (r"model\.decoder\.layers\.(\d+)\.encoder_attn\.v_proj\.(weight|bias)", "decoder.blocks.{0}.cross_attn.value.{1}"),
    (r"model\.decoder\.layers\.(\d+)\.encoder_attn\.out_proj\.(weight|bias)", "decoder.blocks.{0}.cross_attn.out.{1}"),
    (r"model\.decoder\.layers\.(\d+)\.encoder_attn_layer_norm\.(weight|bias)", "decoder.blocks.{0}.cross_attn_ln.{1}"),
    (r"model\.(encoder|decoder)\.layers\.(\d+)\.fc1\.(weight|bias)", "{0}.blocks.{1}.mlp.0.{2}"),
    (r"model\.(encoder|decoder)\.layers\.(\d+)\.fc2\.(weight|bias)", "{0}.blocks.{1}.mlp.2.{2}"),
    (r"model\.(encoder|decoder)\.layers\.(\d+)\.final_layer_norm\.(weight|bias)", "{0}.blocks.{1}.mlp_ln.{2}"),
]
_COMPILED = [(re.compile(p + "$"), t) for p, t in _KEYS]


def openai_key(name: str) -> str:
    for pattern, template in _COMPILED:
        match = pattern.match(name)
        if match:
            return template.format(*match.groups())
    raise KeyError(f"no openai-whisper key for {name}")


def openai_whisper_from(loaded, state_dict: dict[str, torch.Tensor] | None = None):
    """openai-whisper's model with the same weights and alignment heads as ``loaded`` (CPU, fp32); the weights
    come from ``state_dict`` or else the checkpoint ``loaded`` kept (``keep_checkpoint=True``)."""
    state_dict = state_dict if state_dict is not None else loaded.checkpoint.state_dict
    from whisper.model import ModelDimensions, Whisper

    c = loaded.config
    dims = ModelDimensions(
        n_mels=c.num_mel_bins,
        n_audio_ctx=c.max_source_positions,
        n_audio_state=c.d_model,
        n_audio_head=c.encoder_attention_heads,
        n_audio_layer=c.encoder_layers,
        n_vocab=c.vocab_size,
        n_text_ctx=c.max_target_positions,
        n_text_state=c.d_model,
        n_text_head=c.decoder_attention_heads,
        n_text_layer=c.decoder_layers,
    )
    model = Whisper(dims)
    model.load_state_dict({openai_key(k): v.float() for k, v in state_dict.items() if k != "proj_out.weight"})
    heads = torch.zeros(c.decoder_layers, c.decoder_attention_heads, dtype=torch.bool)
    for layer, head in c.word_alignment_heads:
        heads[layer, head] = True
    model.register_buffer("alignment_heads", heads.to_sparse(), persistent=False)
    return model.eval()


# ---------------------------------------------------------------------------------------------- word timestamps


@dataclass
class WordComparison:
    """Our words against openai-whisper's, over however many windows were compared."""

    num_words: int = 0
    num_within: int = 0  # start and end both within the tolerance
    num_exact: int = 0  # both equal to the 10 ms they are rounded to
    text_mismatches: list[tuple[str, str]] = field(default_factory=list)
    worst: list[tuple[float, str]] = field(default_factory=list)

    def add(self, ours: list, theirs: list[dict], tolerance: float) -> None:
        if [w.word for w in ours] != [w["word"] for w in theirs]:
            # Counted as misses: a word we do not give has no time within the tolerance.
            self.text_mismatches.append(("".join(w.word for w in ours), "".join(w["word"] for w in theirs)))
            self.num_words += len(theirs)
            return
        for a, b in zip(ours, theirs):
            error = max(abs(a.start - b["start"]), abs(a.end - b["end"]))
            self.num_words += 1
            self.num_within += error <= tolerance + 1e-9
            self.num_exact += error < 1e-6
            if error > tolerance:
                self.worst.append((error, f"{a.word!r}: ours {a.start}-{a.end}, openai {b['start']}-{b['end']}"))

    @property
    def fraction_within(self) -> float:
        return self.num_within / max(self.num_words, 1)


def openai_spans(window_tokens: list[int], segments: list[dict], seek: int, num_frames: int, special) -> tuple:
    """The segment bounds openai-whisper's transcribe gave this window's segments before word alignment moved
    them, rebuilt from the window's tokens as transcribe does."""
    from oasr.models.whisper.words import TextSpan

    stamp = special.timestamp_begin
    offset = seek * HOP_LENGTH / SAMPLE_RATE
    is_stamp = [t >= stamp for t in window_tokens]
    consecutive = any(a and b for a, b in zip(is_stamp, is_stamp[1:]))
    spans = []
    for segment in segments:
        tokens = segment["tokens"]
        num_text = sum(t < special.eot for t in tokens)
        if consecutive:  # each slice runs from one timestamp to the next
            start, end = offset + (tokens[0] - stamp) * 0.02, offset + (tokens[-1] - stamp) * 0.02
        else:
            stamps = [t for t in tokens if t >= stamp]
            duration = (stamps[-1] - stamp) * 0.02 if stamps and stamps[-1] != stamp else num_frames * HOP_LENGTH / SAMPLE_RATE
            start, end = offset, offset + duration
        spans.append(TextSpan(start, end, num_text))
    return tuple(spans)


def compare_word_timestamps(loaded, reference, audio: np.ndarray, comparisons: dict, *, timestamps: bool,
                            tolerance: float = 0.1) -> None:
    """Runs openai-whisper's transcribe (temperature 0, no fallback, word timestamps) and aligns every window's
    tokens with OASR, once on openai-whisper's own features ("same_features") and once on OASR's features of
    the window's audio ("own_features"); adds both to ``comparisons``.

    Without timestamps, transcribe goes on from the last word's end and decodes the rest of a short clip again
    (mostly silence, where attention means little); only the first window, the one OASR decodes, is compared."""
    import whisper
    from whisper.audio import N_FRAMES, log_mel_spectrogram, pad_or_trim

    from oasr.models.whisper.alignment import AlignmentRow, align_words

    out = whisper.transcribe(reference, audio, temperature=0.0, word_timestamps=True, fp16=False, language="en",
                             without_timestamps=not timestamps)
    special = loaded.tokenizer.special
    mel = log_mel_spectrogram(audio, reference.dims.n_mels, padding=N_SAMPLES_OF_WINDOW)
    content_frames = mel.shape[-1] - N_FRAMES
    windows: dict[int, list[dict]] = {}
    for segment in out["segments"]:
        windows.setdefault(segment["seek"], []).append(segment)
    last = {"same_features": 0.0, "own_features": 0.0}
    for seek, segments in sorted(windows.items()):
        if not timestamps and seek > 0:
            break
        if any(not s["tokens"] for s in segments):
            continue  # transcribe emptied a zero-length segment: its tokens are gone, the window can't be rebuilt
        num_frames = min(N_FRAMES, content_frames - seek)
        tokens = [t for s in segments for t in s["tokens"]]
        spans = openai_spans(tokens, segments, seek, num_frames, special) if timestamps else ()
        theirs = [w for s in segments for w in s["words"]]
        inputs = {
            "same_features": pad_or_trim(mel[:, seek : seek + num_frames], N_FRAMES)[None],
            "own_features": loaded.features([audio[seek * HOP_LENGTH : seek * HOP_LENGTH + N_SAMPLES_OF_WINDOW]]),
        }
        for kind, features in inputs.items():
            row = AlignmentRow(tuple(tokens), num_frames, language="en", time_offset=seek * HOP_LENGTH / SAMPLE_RATE,
                               spans=spans, last_speech_end=last[kind])
            ours = [w for segment in align_words(loaded.model, loaded.tokenizer, [row], features=features)[0]
                    for w in segment.words]
            if ours:
                last[kind] = ours[-1].end
            comparisons.setdefault(kind, WordComparison()).add(ours, theirs, tolerance)
