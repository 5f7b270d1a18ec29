"""Canary shapes with random weights: OASR's engine beside transformers' ``generate`` on identical weights.

    python -m oasr.bench.canary --arch canary-1b-v2 --num-utterances 1024 --output-tokens 32 --device cuda

``--skip-peer`` times OASR alone and prints its encode/decode phases (for trying scheduler settings).

Audio is seeded noise of LibriSpeech-like lengths (2-20 s). Random weights make its content irrelevant, and both
sides decode the same frames with the same weights and exactly ``--output-tokens`` tokens per clip
(end-of-text is held back until then, on both sides), so they do the same work. The peer runs on OASR's
features on the device, its most favourable setting (its features cost what ours cost).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from oasr.bench.parakeet import synthetic_audio, sync
from oasr.bench.profiling import profile_oasr
from oasr.bench.rounds import add_engine_arguments, alternate, report, timed_engine_run

LANGUAGES = ("en", "de", "fr", "es")
# The ids of the first special tokens follow canary-1b-v2's vocabulary (pad 2, end 3, start of transcript 4,
# start of context 7), so transformers' config defaults hold; OASR finds each by name.
SPECIAL_TOKENS = (
    "<unk>", "<|nospeech|>", "<pad>", "<|endoftext|>", "<|startoftranscript|>", "<|pnc|>", "<|nopnc|>",
    "<|startofcontext|>", "<|itn|>", "<|noitn|>", "<|timestamp|>", "<|notimestamp|>", "<|diarize|>",
    "<|nodiarize|>", "<|spkchange|>", "<|audioseparator|>", "<|emo:undefined|>", "<|emo:neutral|>",
    *(f"<|{lang}|>" for lang in LANGUAGES),
)
CANARY_SHAPES = {
    # canary-1b-v2: a 32-layer 1024-wide FastConformer encoder (128 mels), an 8-layer 1024-wide decoder.
    "canary-1b-v2": (dict(hidden_size=1024, num_hidden_layers=32, num_attention_heads=8, intermediate_size=4096,
                          conv_kernel_size=9, subsampling_conv_channels=256, num_mel_bins=128),
                     dict(hidden_size=1024, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=8,
                          intermediate_size=4096, head_dim=128, vocab_size=16384, max_position_embeddings=1024)),
}


def write_vocabulary(path: Path, size: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    pieces = [*SPECIAL_TOKENS, *(f"\u2581w{i}" for i in range(size - len(SPECIAL_TOKENS)))]
    tok = Tokenizer(models.Unigram([(p, -1.0) for p in pieces], unk_id=0))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    tok.save(str(path))


def build(arch: str, directory: Path, seed: int = 0):
    """Saves a randomly initialised transformers Canary of ``arch``'s shape to ``directory``; returns it."""
    import transformers

    encoder, decoder = CANARY_SHAPES[arch]
    torch.manual_seed(seed)
    config = transformers.CanaryConfig(encoder_config=transformers.ParakeetEncoderConfig(**encoder),
                                       decoder_config=transformers.CanaryDecoderConfig(**decoder),
                                       vocab_size=decoder["vocab_size"], tie_word_embeddings=True)
    model = transformers.CanaryForConditionalGeneration(config).eval()
    model.save_pretrained(directory)
    # What transformers' ParakeetFeatureExtractor saves (written here: that class needs librosa to be built).
    preprocessor = dict(feature_extractor_type="ParakeetFeatureExtractor", feature_size=encoder["num_mel_bins"],
                        hop_length=160, n_fft=512, padding_side="right", padding_value=0.0, preemphasis=0.97,
                        return_attention_mask=True, sampling_rate=16000, win_length=400)
    (directory / "preprocessor_config.json").write_text(json.dumps(preprocessor, indent=2))
    write_vocabulary(directory / "tokenizer.json", decoder["vocab_size"])
    return model


def run_transformers(model, audio, prompt, *, batch_size, tokens, device, dtype, extractor):
    ids = []
    sync(device)
    start = time.perf_counter()
    with torch.inference_mode():
        for i in range(0, len(audio), batch_size):
            chunk = audio[i : i + batch_size]
            features, lengths = extractor(chunk, device=device)
            mask = torch.arange(features.shape[-1], device=device)[None, :] < lengths[:, None]
            out = model.generate(input_features=features.transpose(1, 2).to(dtype), attention_mask=mask,
                                 decoder_input_ids=torch.tensor([prompt] * len(chunk), device=device),
                                 do_sample=False, num_beams=1, min_new_tokens=tokens, max_new_tokens=tokens)
            ids.extend(out[:, len(prompt):].tolist())
    sync(device)
    return time.perf_counter() - start, ids


def main(argv: list[str] | None = None) -> None:
    from oasr.engine.config import EngineConfig, RunnerConfig, SchedulerConfig
    from oasr.engine.engine import ASREngine
    from oasr.models.loader import from_pretrained, pick_device, pick_dtype
    from oasr.types import DecodeOptions

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", default="canary-1b-v2", choices=sorted(CANARY_SHAPES))
    add_engine_arguments(parser)
    parser.add_argument("--compile-encoder", action="store_true", help="torch.compile the encoder (CUDA)")
    args = parser.parse_args(argv)
    device = pick_device(args.device)
    dtype = pick_dtype(None if args.dtype == "auto" else args.dtype, device)
    audio = synthetic_audio(args.num_utterances)
    audio_s = sum(len(a) for a in audio) / 16000
    with tempfile.TemporaryDirectory() as tmp:
        reference = build(args.arch, Path(tmp))
        loaded = from_pretrained(tmp, device=device, dtype=dtype)
    options = DecodeOptions(language="en", min_new_tokens=args.output_tokens, max_new_tokens=args.output_tokens)
    engine = ASREngine(loaded, EngineConfig(scheduler=SchedulerConfig(
        max_num_seqs=args.max_num_seqs, max_encode_rows=args.max_encode_rows,
        max_encoder_frames=args.max_encode_rows * 2001, max_combined_encode_rows=args.max_combined_encode_rows,
        min_combined_encode_rows=args.min_combined_encode_rows, decode_steps_per_tick=args.decode_steps_per_tick),
        runner=RunnerConfig(compile_encoder=args.compile_encoder)))
    prompt = list(engine.runner.prompter.prompt(options, None).token_ids)
    reference = reference.to(device=device, dtype=dtype)

    def run_oasr() -> tuple[float, dict[str, list[int]]]:
        return timed_engine_run(engine, audio, options, device)

    def peer(batch_size: int):
        return run_transformers(reference, audio, prompt, batch_size=batch_size, tokens=args.output_tokens,
                                device=device, dtype=dtype, extractor=loaded.features)

    run_oasr()  # warm-up of both sides on the whole set, then alternating timed rounds
    if args.skip_peer:
        engine.runner.phase_seconds.update(encode=0.0, decode=0.0)
        seconds, _ = run_oasr()
        print(json.dumps({"oasr_seconds": round(seconds, 3), "phases": engine.runner.phase_seconds,
                          "max_combined_encode_rows": args.max_combined_encode_rows}))
        if args.profile:
            profile_oasr(run_oasr, args.profile)
        return
    header = {"arch": args.arch, "device": str(device), "dtype": str(dtype), "utterances": len(audio),
              "audio_seconds": round(audio_s, 1), "output_tokens": args.output_tokens}
    print(json.dumps(report(header, alternate(run_oasr, peer, args.peer_batch_sizes, args.rounds), audio_s), indent=2))

if __name__ == "__main__":
    main()
