"""Qwen3-ASR shapes with random weights: OASR's engine beside transformers' ``generate`` on identical weights.

    python -m oasr.bench.qwen3_asr --arch qwen3-asr-1.7b --num-utterances 1024 --output-tokens 32 --device cuda

``--skip-peer`` times OASR alone and prints its encode/decode phases (for trying scheduler settings). ``--keep DIR``
leaves the checkpoint in DIR, to be served (``oasr serve --model DIR``) and loaded (``oasr.bench.serve_load``).

Audio is seeded noise of LibriSpeech-like lengths (2-20 s): random weights make its content irrelevant. Both
sides decode the same prompt (no context, no forced language) and exactly ``--output-tokens`` tokens per clip
(the end tokens are held back until then), so they do the same work. The peer gets OASR's features, computed on
the device (its most favourable setting), and the prompt ids OASR builds, left-padded as transformers'
processor pads them.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from oasr.bench.parakeet import sync, synthetic_audio
from oasr.bench.profiling import profile_oasr
from oasr.bench.rounds import add_engine_arguments, alternate, report, timed_engine_run

# Qwen3-ASR's special tokens at the ids its vocabulary gives them (after Qwen2's 151,643 BPE pieces); OASR finds
# each by name, transformers' config carries the audio, pad and end ids.
SPECIAL_IDS = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<|audio_start|>": 151669,
               "<|audio_end|>": 151670, "<|audio_pad|>": 151676, "<asr_text>": 151704}
QWEN3_ASR_SHAPES = {
    # Qwen3-ASR-1.7B: a 24-layer 1024-wide audio encoder (128 mels) spliced into Qwen3-1.7B (28 layers, 2048 wide,
    # 16 query heads over 8 key/value heads of 128).
    "qwen3-asr-1.7b": (dict(num_mel_bins=128, d_model=1024, encoder_layers=24, encoder_attention_heads=16,
                            encoder_ffn_dim=4096, output_dim=2048, downsample_hidden_size=480, n_window=50,
                            n_window_infer=800),
                       dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                            num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=4096,
                            rms_norm_eps=1e-6, tie_word_embeddings=True,
                            rope_parameters={"rope_theta": 1_000_000.0, "rope_type": "default"})),
}


def write_vocabulary(path: Path, size: int) -> None:
    """A byte-level BPE of ``size`` ids: the 256 byte symbols, filler pieces, the special tokens at their ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {symbol: i for i, symbol in enumerate(alphabet)}
    by_id = {i: token for token, i in SPECIAL_IDS.items()}
    for i in range(len(alphabet), size):
        vocab[by_id.get(i, f"w{i}")] = i
    tok = Tokenizer(models.BPE(vocab, []))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIAL_IDS))
    tok.save(str(path))


def build(arch: str, directory: Path, device: torch.device, dtype: torch.dtype, seed: int = 0,
          max_positions: int | None = None):
    """Saves a randomly initialised transformers Qwen3-ASR of ``arch``'s shape to ``directory``; returns it (built
    on ``device`` in ``dtype``: initialising two billion weights on the host takes minutes). ``max_positions``
    bounds the language model's positions (random weights rarely end a request: this bounds its length)."""
    import transformers

    audio, text = QWEN3_ASR_SHAPES[arch]
    if max_positions is not None:
        text = {**text, "max_position_embeddings": max_positions}
    torch.manual_seed(seed)
    config = transformers.Qwen3ASRConfig(
        audio_config=audio, text_config=text, audio_token_id=SPECIAL_IDS["<|audio_pad|>"],
        pad_token_id=SPECIAL_IDS["<|im_end|>"], eos_token_id=[SPECIAL_IDS["<|endoftext|>"], SPECIAL_IDS["<|im_end|>"]])
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = transformers.Qwen3ASRForConditionalGeneration(config).eval()
    finally:
        torch.set_default_dtype(previous)
    model.save_pretrained(directory)
    transformers.Qwen3ASRFeatureExtractor(feature_size=audio["num_mel_bins"]).save_pretrained(directory)
    write_vocabulary(directory / "tokenizer.json", text["vocab_size"])
    return model


def peer_inputs(prompts: list[list[int]], features: torch.Tensor, frames: torch.Tensor, pad: int,
                device: torch.device) -> dict[str, torch.Tensor]:
    """transformers' inputs for one batch: prompts left-padded with their attention mask, the features and their
    frame mask."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.tensor(prompt)
        mask[row, width - len(prompt):] = 1
    frame_mask = torch.arange(features.shape[-1], device=device)[None, :] < frames.to(device)[:, None]
    return dict(input_ids=ids.to(device), attention_mask=mask.to(device), input_features=features,
                input_features_mask=frame_mask.long())


def run_transformers(model, audio, prompts, *, batch_size, tokens, device, dtype, extractor):
    ids = []
    pad = SPECIAL_IDS["<|im_end|>"]
    sync(device)
    start = time.perf_counter()
    with torch.inference_mode():
        for i in range(0, len(audio), batch_size):
            chunk = audio[i : i + batch_size]
            features = extractor(chunk, device=device).to(dtype)
            frames = extractor.frame_lengths(torch.tensor([len(a) for a in chunk]))
            inputs = peer_inputs(prompts[i : i + batch_size], features, frames, pad, device)
            out = model.generate(**inputs, do_sample=False, num_beams=1, min_new_tokens=tokens,
                                 max_new_tokens=tokens, pad_token_id=pad)
            ids.extend(out[:, inputs["input_ids"].shape[1]:].tolist())
    sync(device)
    return time.perf_counter() - start, ids


def main(argv: list[str] | None = None) -> None:
    from oasr.engine.config import EngineConfig, RunnerConfig, SchedulerConfig
    from oasr.engine.engine import ASREngine
    from oasr.models.loader import from_pretrained, pick_device, pick_dtype
    from oasr.types import DecodeOptions

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", default="qwen3-asr-1.7b", choices=sorted(QWEN3_ASR_SHAPES))
    add_engine_arguments(parser)
    parser.add_argument("--backend", default="kernels", choices=("torch", "kernels"))
    parser.add_argument("--max-positions", type=int, default=None,
                        help="the language model's positions (default: the shape's); bounds a request served later")
    parser.add_argument("--keep", type=Path, default=None, metavar="DIR",
                        help="keep the random checkpoint in DIR (for `oasr serve --model DIR`)")
    args = parser.parse_args(argv)
    device = pick_device(args.device)
    dtype = pick_dtype(None if args.dtype == "auto" else args.dtype, device)
    audio = synthetic_audio(args.num_utterances)
    audio_s = sum(len(a) for a in audio) / 16000
    with tempfile.TemporaryDirectory() as tmp:
        directory = args.keep or Path(tmp)
        directory.mkdir(parents=True, exist_ok=True)
        reference = build(args.arch, directory, device, dtype, max_positions=args.max_positions)
        loaded = from_pretrained(directory, device=device, dtype=dtype, backend=args.backend)
    options = DecodeOptions(min_new_tokens=args.output_tokens, max_new_tokens=args.output_tokens)
    engine = ASREngine(loaded, EngineConfig(scheduler=SchedulerConfig(
        max_num_seqs=args.max_num_seqs, max_encode_rows=args.max_encode_rows,
        max_encoder_frames=args.max_encode_rows * 2001, max_combined_encode_rows=args.max_combined_encode_rows,
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

    run_oasr()  # warm-up of both sides on the whole set, then alternating timed rounds
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
