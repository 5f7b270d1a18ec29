"""Voxtral shapes with random weights: OASR's engine beside transformers' ``generate`` on identical weights.

    python -m oasr.bench.voxtral --arch voxtral-mini-3b --num-utterances 1024 --output-tokens 32 --device cuda

As ``oasr.bench.qwen3_asr``: seeded noise of LibriSpeech-like lengths (2-20 s, one 30 s window each), the same
transcription request on both sides (no forced language) and exactly ``--output-tokens`` tokens per clip. The peer
gets OASR's features, computed on the device, and the prompt ids OASR builds (all of one length here: every clip
is one window).
"""

from __future__ import annotations

import argparse
import base64
import json
import tempfile
import time
from pathlib import Path

import torch

from oasr.bench.parakeet import sync, synthetic_audio
from oasr.bench.profiling import profile_oasr
from oasr.bench.rounds import add_engine_arguments, alternate, report, timed_engine_run

NUM_SPECIAL = 1000  # control tokens before the BPE ranks, as in Mistral's tekken files
SPECIAL_NAMES = {0: "<unk>", 1: "<s>", 2: "</s>", 3: "[INST]", 4: "[/INST]", 11: "<pad>", 24: "[AUDIO]",
                 25: "[BEGIN_AUDIO]", 34: "[TRANSCRIBE]"}
PATTERN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?"
           r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+"
           r"|\s+(?!\S)|\s+")
VOXTRAL_SHAPES = {
    # Voxtral-Mini-3B-2507: Whisper large-v3's encoder (32 layers, 1280 wide, 128 mels) and a 30-layer 3072-wide
    # Mistral LM (32 query heads over 8 key/value heads of 128, rope theta 1e8).
    "voxtral-mini-3b": (dict(hidden_size=1280, intermediate_size=5120, num_hidden_layers=32, num_attention_heads=20,
                             num_mel_bins=128, max_source_positions=1500),
                        dict(vocab_size=131072, hidden_size=3072, intermediate_size=8192, num_hidden_layers=30,
                             num_attention_heads=32, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-5,
                             max_position_embeddings=8192, rope_theta=100_000_000.0, tie_word_embeddings=False)),
    # A few-layer stand-in with the same geometry in time, to try the bench on a host.
    "tiny": (dict(hidden_size=32, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_mel_bins=16, max_source_positions=1500),
             dict(vocab_size=2048, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5, max_position_embeddings=4096,
                  rope_theta=10_000.0, tie_word_embeddings=False)),
}


def write_vocabulary(path: Path, size: int) -> None:
    """A tekken.json of ``size`` ids: the control tokens (those of the transcription request by name), the 256
    byte symbols, then filler pieces of two and three bytes."""
    pieces = [bytes([i]) for i in range(256)]
    filler = (bytes([a, b]) for a in range(256) for b in range(256))
    triples = (bytes([a, b, c]) for a in range(256) for b in range(256) for c in range(256))
    for piece in (*filler, *triples):
        if len(pieces) >= size - NUM_SPECIAL:
            break
        pieces.append(piece)
    data = {"config": {"pattern": PATTERN, "num_vocab_tokens": len(pieces), "default_vocab_size": size,
                       "default_num_special_tokens": NUM_SPECIAL, "version": "v7"},
            "vocab": [{"rank": i, "token_bytes": base64.b64encode(p).decode(), "token_str": None}
                      for i, p in enumerate(pieces)],
            "special_tokens": [{"rank": i, "token_str": SPECIAL_NAMES.get(i, f"<SPECIAL_{i}>"), "is_control": True}
                               for i in range(NUM_SPECIAL)]}
    path.write_text(json.dumps(data))


def build(arch: str, directory: Path, device: torch.device, dtype: torch.dtype, seed: int = 0):
    """Saves a randomly initialised transformers Voxtral of ``arch``'s shape to ``directory``; returns it (built on
    ``device`` in ``dtype``)."""
    import transformers

    audio, text = VOXTRAL_SHAPES[arch]
    torch.manual_seed(seed)
    config = transformers.VoxtralConfig(audio_config=audio, text_config={**text, "model_type": "llama"},
                                        audio_token_id=24)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = transformers.VoxtralForConditionalGeneration(config).eval()
    finally:
        torch.set_default_dtype(previous)
    model.save_pretrained(directory)
    transformers.WhisperFeatureExtractor(feature_size=audio["num_mel_bins"]).save_pretrained(directory)
    write_vocabulary(directory / "tekken.json", text["vocab_size"])
    return model


def run_transformers(model, audio, prompts, *, batch_size, tokens, device, dtype, extractor):
    """transformers' greedy ``generate`` over ``audio`` in batches (prompts left-padded with ``<pad>``)."""
    ids = []
    sync(device)
    start = time.perf_counter()
    with torch.inference_mode():
        for i in range(0, len(audio), batch_size):
            chunk, chunk_prompts = audio[i : i + batch_size], prompts[i : i + batch_size]
            features = extractor(chunk, device=device).to(dtype)  # one window each: [B, n_mels, 3000]
            width = max(len(p) for p in chunk_prompts)
            input_ids = torch.full((len(chunk), width), 11, dtype=torch.long)
            mask = torch.zeros_like(input_ids)
            for row, prompt in enumerate(chunk_prompts):
                input_ids[row, width - len(prompt):] = torch.tensor(prompt)
                mask[row, width - len(prompt):] = 1
            out = model.generate(input_ids=input_ids.to(device), attention_mask=mask.to(device),
                                 input_features=features, do_sample=False, num_beams=1, min_new_tokens=tokens,
                                 max_new_tokens=tokens, pad_token_id=11, eos_token_id=2)
            ids.extend(out[:, width:].tolist())
    sync(device)
    return time.perf_counter() - start, ids


def main(argv: list[str] | None = None) -> None:
    from oasr.engine.config import EngineConfig, RunnerConfig, SchedulerConfig
    from oasr.engine.engine import ASREngine
    from oasr.models.loader import from_pretrained, pick_device, pick_dtype
    from oasr.types import DecodeOptions

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", default="voxtral-mini-3b", choices=sorted(VOXTRAL_SHAPES))
    add_engine_arguments(parser)
    parser.add_argument("--backend", default="kernels", choices=("torch", "kernels"))
    args = parser.parse_args(argv)
    device = pick_device(args.device)
    dtype = pick_dtype(None if args.dtype == "auto" else args.dtype, device)
    audio = synthetic_audio(args.num_utterances)
    audio_s = sum(len(a) for a in audio) / 16000
    with tempfile.TemporaryDirectory() as tmp:
        reference = build(args.arch, Path(tmp), device, dtype)
        loaded = from_pretrained(tmp, device=device, dtype=dtype, backend=args.backend)
    options = DecodeOptions(min_new_tokens=args.output_tokens, max_new_tokens=args.output_tokens)
    window = loaded.config.audio_config.window_frames
    engine = ASREngine(loaded, EngineConfig(scheduler=SchedulerConfig(
        max_num_seqs=args.max_num_seqs, max_encode_rows=args.max_encode_rows,
        max_encoder_frames=args.max_encode_rows * window, max_combined_encode_rows=args.max_combined_encode_rows,
        min_combined_encode_rows=args.min_combined_encode_rows, decode_steps_per_tick=args.decode_steps_per_tick),
        runner=RunnerConfig()))
    frames = loaded.features.frame_lengths(torch.tensor([len(a) for a in audio]))
    prompts = [list(engine.runner.prompter.prompt(options, None, loaded.model.encoder_frames(int(n))).token_ids)
               for n in frames]

    def run_oasr() -> tuple[float, dict[str, list[int]]]:
        return timed_engine_run(engine, audio, options, device)

    def peer(batch_size: int):
        return run_transformers(reference, audio, prompts, batch_size=batch_size, tokens=args.output_tokens,
                                device=device, dtype=dtype, extractor=loaded.features)

    run_oasr()  # warm-up, then alternating timed rounds
    if args.skip_peer:
        engine.runner.phase_seconds.update(encode=0.0, decode=0.0)
        seconds, _ = run_oasr()
        print(json.dumps({"oasr_seconds": round(seconds, 3), "audio_seconds_per_second": round(audio_s / seconds, 1),
                          "phases": engine.runner.phase_seconds}))
        if args.profile:
            profile_oasr(run_oasr, args.profile)
        return
    header = {"arch": args.arch, "device": str(device), "dtype": str(dtype), "utterances": len(audio),
              "audio_seconds": round(audio_s, 1), "output_tokens": args.output_tokens, "backend": args.backend}
    print(json.dumps(report(header, alternate(run_oasr, peer, args.peer_batch_sizes, args.rounds), audio_s), indent=2))


if __name__ == "__main__":
    main()
