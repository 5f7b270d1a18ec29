"""``kv_cache_dtype="fp8"``: the decoder caches in e4m3 with a scale per position and head.

The quantizer's precision; the Triton kernels against their torch references with e4m3 pools (interpreter on
CPU, native on CUDA); the engine's stores against dense attention over the same rounded values (the paged
cross-attention blocks' test is ``tests/test_paged_attention.py``'s); whole transcriptions against the
full-precision cache (tiny.en on the shared English clips: WER and tokens; Canary, Cohere and Qwen3-ASR tiny
checkpoints: tokens); memory plans; refusals.
"""

from __future__ import annotations

import textwrap

import pytest
import torch

from aed_reference import audio_batch, make_canary_checkpoint, make_cohere_checkpoint
from cross_projector import Projector
from oasr.audio import load_audio
from oasr.bench.wer import word_error_rate
from oasr.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from oasr.engine.cross_cache import SlotCrossStore
from oasr.engine.engine import ASREngine
from oasr.engine.kv_cache import PagedKVPool, paged_context
from oasr.engine.memory import plan_memory
from oasr.engine.step import EncodeRow
from oasr.errors import UnsupportedOptionError
from oasr.kernels.paged_attention import paged_decode_attention_reference
from oasr.layers import kv_format
from oasr.layers.cache import DenseCross
from oasr.layers.kv_format import FP8, KVFormat, dequantize_heads, quantize_heads
from oasr.models.base import CrossSpec, DecoderSpec
from oasr.models.loader import from_pretrained
from oasr.types import DecodeOptions
from speech_data import audio_path, english_short, require_speech_data
from test_kernels import worst_error_interpreted

FP8_CACHE = KVFormat("fp8", torch.float32)


def test_each_head_keeps_e4m3_precision_relative_to_its_own_range() -> None:
    torch.manual_seed(0)
    # Heads whose ranges differ by twelve orders of magnitude, and an all-zero head.
    x = torch.randn(50, 4, 64) * torch.tensor([1e-6, 1.0, 1e3, 1e6])[None, :, None]
    x[:, 2] = 0.0
    values, scale = quantize_heads(x)
    assert values.dtype == FP8 and scale.shape == (50, 4)
    back = dequantize_heads(values, scale, torch.float32)
    amax = x.abs().amax(-1, keepdim=True)
    # Three mantissa bits: a normal value is within 1/16 of itself; below e4m3's smallest normal (2^-6 of the
    # scale, i.e. amax * 2^-6 / 448) the step is 2^-9 of the scale.
    bound = x.abs() / 16 + amax / 448 * 2.0**-10
    assert ((back - x).abs() <= bound * 1.0001).all()
    assert back[:, 2].eq(0).all()
    assert back.abs().amax(-1).allclose(amax[..., 0], rtol=1e-6)  # each head's largest value is kept exactly


def filled(kind: str, fmt: KVFormat, layers: int = 2, heads: int = 3, dim: int = 16, block: int = 4,
           blocks: int = 9, kv_heads: int | None = None) -> PagedKVPool:
    spec = DecoderSpec(layers, heads, kv_heads or heads, dim, blocks * block, CrossSpec(max_len=1, fixed=False))
    pool = PagedKVPool(spec, blocks, block, fmt, torch.device("cpu"))
    if kind == "random":
        rows = torch.arange(blocks * block)
        for layer in range(layers):
            for data, scale in ((pool.k, pool.k_scale), (pool.v, pool.v_scale)):
                kv_format.store(data[layer], None if scale is None else scale[layer], rows,
                                torch.randn(blocks * block, kv_heads or heads, dim) * 4, block)
    return pool


@pytest.mark.parametrize("heads,kv_heads", [(3, 3), (6, 2)])
def test_an_e4m3_pool_attends_as_dense_attention_over_the_rounded_values(heads: int, kv_heads: int) -> None:
    """A decode step through ``PagedContext`` on the torch path stores the new K/V rounded (with their scales) and
    attends as dense attention does over every position's dequantized values, its own included."""
    torch.manual_seed(1)
    pool = filled("random", FP8_CACHE, heads=heads, kv_heads=kv_heads)
    table = torch.tensor([[3, 5], [7, 1], [2, 8], [0, 0]])
    positions = torch.tensor([5, 0, 7, 2])
    q = torch.randn(4, heads, 1, 16)
    k, v = (torch.randn(4, kv_heads, 1, 16) for _ in range(2))
    got = paged_context(pool, table, positions[:, None]).attend(1, q, k, v)[:, :, 0]
    rows = pool.rows(table)
    keys = kv_format.gather(pool.k[1], pool.k_scale[1], rows, 4, torch.float32)  # [B, L, Hkv, D], as stored now
    values = kv_format.gather(pool.v[1], pool.v_scale[1], rows, 4, torch.float32)
    new_k = dequantize_heads(*quantize_heads(k[:, :, 0]), torch.float32)
    own = rows.gather(1, positions[:, None])[:, 0]
    assert torch.equal(keys[torch.arange(4), positions], new_k)  # the new token's row holds its rounded key
    assert own.tolist() == [5 * 4 + 1, 7 * 4 + 0, 8 * 4 + 3, 0 * 4 + 2]
    mask = (torch.arange(rows.shape[1])[None, :] <= positions[:, None])[:, None, None, :]
    group = heads // kv_heads
    want = torch.nn.functional.scaled_dot_product_attention(
        q, keys.transpose(1, 2).repeat_interleave(group, 1), values.transpose(1, 2).repeat_interleave(group, 1),
        attn_mask=mask)[:, :, 0]
    assert torch.allclose(got, want, atol=1e-6)
    # The kernel's reference computes the same numbers from the pool as it was before the step.
    torch.manual_seed(1)
    before = filled("random", FP8_CACHE, heads=heads, kv_heads=kv_heads)
    reference = paged_decode_attention_reference(q[:, :, 0], k[:, :, 0], v[:, :, 0], *before.layer(1)[:2], table,
                                                 positions, 4, *before.layer(1)[2:])
    assert torch.allclose(got, reference, atol=1e-6)


def test_copying_blocks_moves_their_scales_too() -> None:
    torch.manual_seed(2)
    pool = filled("random", FP8_CACHE)
    source, target = torch.tensor([[2, 5]]), torch.tensor([[6, 1]])
    pool.copy_blocks(source, target)
    for layer in range(2):
        want = kv_format.gather(pool.k[layer], pool.k_scale[layer], pool.rows(source), 4, torch.float32)
        got = kv_format.gather(pool.k[layer], pool.k_scale[layer], pool.rows(target), 4, torch.float32)
        assert torch.equal(got, want)
        assert torch.equal(pool.v_scale[layer, 6], pool.v_scale[layer, 2])


_INTERPRETED = textwrap.dedent("""
    import torch
    from oasr.kernels.paged_attention import (paged_cross_attention, paged_cross_attention_reference,
                                              paged_decode_attention, paged_decode_attention_reference)
    from oasr.kernels.kv_store import store_scaled
    from oasr.layers import kv_format
    from oasr.layers.kv_format import FP8, quantize_heads
    torch.manual_seed(0)
    # Normal values e4m3 holds exactly, powers of two left out, with each head's largest at 448: the
    # interpreter's float -> e4m3 conversion rounds a value that should round up to a power of two (subnormals
    # included) down by half (hardware does not), and a value scaled by a float scale lands a last bit off its
    # grid point, possibly just under it.
    codes = torch.arange(256, dtype=torch.uint8)
    grid = codes.view(FP8).float()
    grid = grid[grid.isfinite() & (codes & 7 != 0) & (codes & 0x78 != 0)]
    def exact(*shape):
        x = grid[torch.randint(len(grid), shape)]
        x[..., 0] = 448.0
        return x
    def pool(rows, heads, d, block_size):  # each position's and head's own scale (a power of two apart: exact)
        values, scales = quantize_heads(exact(rows, heads, d) * 0.01 * 2.0 ** torch.randint(-2, 3, (rows, heads, 1)))
        return values, scales.view(rows // block_size, block_size, heads).transpose(1, 2).contiguous()
    worst = 0.0
    for b, h, kv, d, block_size, nb in [(4, 3, 3, 16, 4, 3), (3, 6, 2, 32, 16, 2), (2, 1, 1, 64, 8, 5)]:
        rows = (1 + b * nb) * block_size
        (k_pool, k_scale), (v_pool, v_scale) = pool(rows, kv, d, block_size), pool(rows, kv, d, block_size)
        table = (1 + torch.randperm(b * nb)).view(b, nb)
        positions = torch.tensor([0, block_size, nb * block_size - 1, block_size // 2 + 1][:b])
        q, k, v = torch.randn(b, h, d), exact(b, kv, d) * 0.02, exact(b, kv, d) * 0.03
        pools = [t.clone() for t in (k_pool, v_pool, k_scale, v_scale)]
        got = paged_decode_attention(q, k, v, pools[0], pools[1], table, positions, block_size, pools[2], pools[3])
        want = paged_decode_attention_reference(q, k, v, k_pool, v_pool, table, positions, block_size, k_scale,
                                                v_scale)
        stored = [a.view(torch.uint8).ne(b.view(torch.uint8)).sum().item() for a, b in zip(pools, (k_pool, v_pool))]
        worst = max(worst, (got - want).abs().max().item(), *stored,
                    *((a - b).abs().max().item() / b.abs().max().item() for a, b in zip(pools[2:], (k_scale, v_scale))))
        lengths = torch.tensor([nb * block_size, 1, block_size + block_size // 2, 0][:b])
        q = torch.randn(b, kv, d)
        want = paged_cross_attention_reference(q, k_pool, v_pool, table, lengths, block_size, k_scale, v_scale)
        # The positions in one program per row and head group, or split and combined; one head per program, or
        # two adjacent heads read together.
        for splits, group in ((1, 1), (2, 1), (3, 1), (1, 2), (3, 2)):
            if kv % group == 0:
                got = paged_cross_attention(q, k_pool, v_pool, table, lengths, block_size, k_scale, v_scale,
                                            block_n=16, splits=splits, heads_per_program=group)
                worst = max(worst, (got - want).abs().max().item())
        # New positions rounded into the pool in one pass: the torch path's bytes and scales.
        new_rows = torch.randperm(rows)[: 2 * block_size]
        fresh = exact(len(new_rows), kv, d) * 0.05
        torch_pool, torch_scale = k_pool.clone(), k_scale.clone()
        kv_format.store(torch_pool, torch_scale, new_rows, fresh, block_size)
        store_scaled(k_pool, k_scale, new_rows, fresh, block_size)
        worst = max(worst, k_pool.view(torch.uint8).ne(torch_pool.view(torch.uint8)).sum().item(),
                    (k_scale - torch_scale).abs().max().item() / torch_scale.abs().max().item())
    print(worst)
""")


def test_the_kernels_over_e4m3_pools_equal_their_references_in_the_interpreter() -> None:
    assert worst_error_interpreted(_INTERPRETED) < 1e-5


def dense_rounded(hidden: torch.Tensor, layers: int, heads: int, dim: int) -> DenseCross:
    """DenseCross over ``Projector``'s K/V as e4m3 holds them."""
    def rounded(x):
        return dequantize_heads(*quantize_heads(x.unflatten(-1, (heads, dim))), torch.float32).transpose(1, 2)

    k = torch.stack([rounded(hidden * (i + 1)) for i in range(layers)])
    v = torch.stack([rounded(-hidden * (i + 1)) for i in range(layers)])
    return DenseCross(k, v)


def test_e4m3_window_slots_read_what_dense_attention_over_the_rounded_values_reads() -> None:
    """Whisper's fixed-window store in e4m3: rows in any slots, a beam request in two; prompts (several queries)
    and steps (one, through ``context``) both read each row's own slot."""
    torch.manual_seed(3)
    layers, heads, dim, window = 2, 2, 8, 6
    spec = DecoderSpec(layers, heads, heads, dim, 16, CrossSpec(max_len=window, fixed=True))
    store = SlotCrossStore(spec, 5, FP8_CACHE, torch.device("cpu"))
    hidden = torch.randn(2, window, heads * dim) * 3
    rows = (EncodeRow("a", (3,), ((),)), EncodeRow("b", (0, 4), ((), ())))
    prompt_view = store.write(Projector(), rows, hidden, [window, window])
    dense = dense_rounded(hidden, layers, heads, dim)
    q = torch.randn(2, heads, 3, dim)
    for layer in range(layers):
        want = dense.attend(layer, q)
        assert torch.allclose(prompt_view.attend(layer, q), want, atol=1e-6)
        step = store.context(5).attend(layer, q[:, :, :1][[1, 0, 0, 0, 1]])  # slots 0..4 hold b, -, -, a, b
        for slot, row in ((3, 0), (0, 1), (4, 1)):
            assert torch.allclose(step[slot], want[row, :, :1], atol=1e-6), (layer, slot)
        assert torch.equal(store.context(5).keys(layer)[4], dense.keys(layer)[1])
    full = DenseCross(*(torch.stack([s * hidden.unflatten(-1, (heads, dim)).transpose(1, 2) * (i + 1)
                                     for i in range(layers)]) for s in (1, -1)))
    exact = full.attend(1, q)  # and within e4m3's few percent of full precision
    assert (prompt_view.attend(1, q) - exact).abs().max() < 0.1 * exact.abs().max()


def test_an_fp8_cache_holds_about_twice_the_requests_of_a_float16_one() -> None:
    spec = DecoderSpec(32, 20, 20, 64, 448, CrossSpec(max_len=1500, fixed=True))  # large-v3's decoder
    cache = CacheConfig(memory_budget_bytes=24 << 30)
    device = torch.device("cpu")
    half = plan_memory(spec, cache, max_num_seqs=1024, fmt=KVFormat("auto", torch.float16), device=device)
    fp8 = plan_memory(spec, cache, max_num_seqs=1024, fmt=KVFormat("fp8", torch.float16), device=device)
    per_slot_half = 2 * 32 * 1500 * 20 * 64 * 2
    per_slot_fp8 = 2 * 32 * 1500 * 20 * (64 + 4)  # a byte per value and a float32 scale per head
    assert half.num_slots == int((24 << 30) * 0.8) // per_slot_half
    assert fp8.num_slots == int((24 << 30) * 0.8) // per_slot_fp8
    assert fp8.num_slots >= 1.8 * half.num_slots


@pytest.fixture(scope="module")
def english_clips():
    require_speech_data()
    entries = english_short(30.0)[:12]
    return entries, [load_audio(audio_path(e), channel=e.get("channel")) for e in entries]


def transcribe(loaded, audio, kv: str, options: DecodeOptions = DecodeOptions()) -> list[list[int]]:
    config = EngineConfig(cache=CacheConfig(memory_budget_bytes=256 << 20, kv_cache_dtype=kv))
    engine = ASREngine(loaded, config)
    caches = [engine.runner.pool.k, getattr(engine.runner.cross, "k", engine.runner.pool.k)]
    assert all((cache.dtype == FP8) == (kv == "fp8") for cache in caches)  # the format reached every cache
    out = {o.request_id: o.token_ids for o in engine.run((f"c{i}", a, options) for i, a in enumerate(audio))}
    return [out[f"c{i}"] for i in range(len(audio))]


def test_tiny_en_with_an_fp8_cache_transcribes_the_english_clips_as_well(tiny_en, english_clips) -> None:
    entries, audio = english_clips
    full, fp8 = transcribe(tiny_en, audio, "auto"), transcribe(tiny_en, audio, "fp8")
    references = [e["text"] for e in entries]
    wer_full = word_error_rate(references, [tiny_en.tokenizer.decode(t) for t in full]).wer
    wer_fp8 = word_error_rate(references, [tiny_en.tokenizer.decode(t) for t in fp8]).wer
    assert wer_fp8 <= wer_full + 0.01, (wer_full, wer_fp8)
    same = sum(a == b for a, b in zip(full, fp8, strict=True))
    assert same >= 0.75 * len(full), f"{same} of {len(full)} clips decode to the same tokens"
    # Beam search copies each beam's blocks (and their scales) as it reorders.
    beams = transcribe(tiny_en, audio[:3], "fp8", DecodeOptions(beam_size=3))
    assert word_error_rate(references[:3], [tiny_en.tokenizer.decode(t) for t in beams]).wer <= wer_full + 0.05


@pytest.mark.parametrize("family", ["canary", "cohere_asr", "qwen3_asr"])
def test_the_other_decoders_decode_with_an_fp8_cache(family: str, tmp_path) -> None:
    """Paged cross-attention blocks (Canary, Cohere) and a decoder-only prompt (Qwen3-ASR, grouped heads) in e4m3
    decode as the full-precision cache does (random weights, so only for a few steps)."""
    if family == "qwen3_asr":
        from qwen3_reference import make_checkpoint

        directory = make_checkpoint(tmp_path)
        options = DecodeOptions(max_new_tokens=16)
    else:
        directory = (make_canary_checkpoint if family == "canary" else make_cohere_checkpoint)(tmp_path)
        options = DecodeOptions(language="en", max_new_tokens=16)
    loaded = from_pretrained(directory, device="cpu", dtype="float32")
    audio = audio_batch()
    full, fp8 = transcribe(loaded, audio, "auto", options), transcribe(loaded, audio, "fp8", options)
    assert sum(len(t) for t in full) >= 8, "nothing decoded: the comparison could hardly fail"
    # Random weights leave near-ties that e4m3's rounding may flip, and a flipped token changes every later one:
    # each row must agree for its first few steps (a cache read wrongly changes the first).
    for row_full, row_fp8 in zip(full, fp8, strict=True):
        assert row_fp8[:4] == row_full[:4], (full, fp8)


def test_an_unknown_kv_cache_dtype_and_unsupported_places_are_refused(monkeypatch, tiny_en) -> None:
    with pytest.raises(ValueError, match="kv_cache_dtype 'int4'"):
        CacheConfig(kv_cache_dtype="int4")
    with pytest.raises(UnsupportedOptionError, match="runs on CUDA and the CPU, not on mps"):
        kv_format.format_for("fp8", torch.float16, torch.device("mps"))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100")
    with pytest.raises(UnsupportedOptionError, match=r"capability 8.9 or newer .* NVIDIA A100 is 8.0"):
        kv_format.format_for("fp8", torch.float16, torch.device("cuda"))
    assert kv_format.format_for("auto", torch.float16, torch.device("cuda")).storage_dtype == torch.float16


def test_a_frame_sync_model_refuses_an_fp8_cache(tmp_path) -> None:
    from parakeet_reference import build_reference, write_tokenizer

    build_reference("ctc").save_pretrained(tmp_path)
    write_tokenizer(tmp_path / "tokenizer.json", "<pad>")
    loaded = from_pretrained(tmp_path, device="cpu", dtype="float32")
    config = EngineConfig(cache=CacheConfig(kv_cache_dtype="fp8"), scheduler=SchedulerConfig(max_num_seqs=2))
    with pytest.raises(UnsupportedOptionError, match="keeps no decoder K/V cache"):
        ASREngine(loaded, config)


def test_a_streaming_engine_refuses_an_fp8_cache_when_built(tmp_path) -> None:
    from nemotron_reference import build_reference, save
    from oasr.engine.combined import Engine

    loaded = from_pretrained(save(build_reference(), tmp_path), device="cpu", dtype="float32")
    with pytest.raises(UnsupportedOptionError, match="kv_cache_dtype 'fp8' does not apply"):
        Engine(loaded, EngineConfig(cache=CacheConfig(kv_cache_dtype="fp8")))
    Engine(loaded, EngineConfig())  # the default format is no request at all


def test_the_cli_transcribes_with_an_fp8_cache(capsys, monkeypatch) -> None:
    import oasr.engine.autoregressive as autoregressive
    from oasr.cli import main

    asked = []
    real = autoregressive.format_for
    monkeypatch.setattr(autoregressive, "format_for", lambda name, *rest: asked.append(name) or real(name, *rest))
    assert main(["transcribe", "oasr/assets/jfk.flac", "--model", "tiny.en", "--device", "cpu",
                 "--kv-cache-dtype", "fp8"]) == 0
    assert "ask not what your country can do for you" in capsys.readouterr().out
    assert asked == ["fp8"]  # the flag reached the engine


@pytest.mark.gpu
@pytest.mark.parametrize("h,kv,d", [(20, 20, 64), (16, 8, 128)])
def test_the_kernels_over_e4m3_pools_equal_their_references_on_cuda(h: int, kv: int, d: int) -> None:
    from oasr.kernels.paged_attention import paged_cross_attention, paged_cross_attention_reference
    from oasr.kernels.paged_attention import paged_decode_attention

    torch.manual_seed(0)
    b, block, nb = 64, 16, 28
    rows = (1 + b * nb) * block

    def pool():
        values, scales = quantize_heads(torch.randn(rows, kv, d, device="cuda") * 3)
        return values, scales.view(rows // block, block, kv).transpose(1, 2).contiguous()

    (k_pool, k_scale), (v_pool, v_scale) = pool(), pool()
    table = (1 + torch.randperm(b * nb, device="cuda")).view(b, nb)
    positions = torch.randint(0, nb * block, (b,), device="cuda")
    q = torch.randn(b, h, d, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(b, kv, d, device="cuda", dtype=torch.float16) for _ in range(2))
    pools = [t.clone() for t in (k_pool, v_pool, k_scale, v_scale)]
    got = paged_decode_attention(q, k, v, pools[0], pools[1], table, positions, block, pools[2], pools[3])
    want = paged_decode_attention_reference(q, k, v, k_pool, v_pool, table, positions, block, k_scale, v_scale)
    assert (got.float() - want.float()).abs().max().item() < 1e-2  # the reference attends in float16
    # The new tokens' bytes and scales: the same rounding as torch's (the kernel's reciprocal is correctly rounded).
    changed = sum(a.view(torch.uint8).ne(b.view(torch.uint8)).sum().item() for a, b in zip(pools, (k_pool, v_pool)))
    assert changed <= 2 * b * kv * d * 1e-3
    assert torch.equal(pools[2], k_scale) and torch.equal(pools[3], v_scale)
    lengths = torch.randint(0, nb * block, (b,), device="cuda")
    qc = torch.randn(b, kv, d, device="cuda", dtype=torch.float16)
    want = paged_cross_attention_reference(qc, k_pool, v_pool, table, lengths, block, k_scale, v_scale)
    for splits in (1, 3, 8):
        for group in (None, 1, 2, 4):  # the default, and one, two or four heads a program
            got = paged_cross_attention(qc, k_pool, v_pool, table, lengths, block, k_scale, v_scale, splits=splits,
                                        heads_per_program=group)
            assert (got.float() - want.float()).abs().max().item() < 1e-2, (splits, group)
    # The one-pass store against torch's seven, on values of every magnitude.
    from oasr.kernels.kv_store import store_scaled

    new_rows = torch.randperm(rows, device="cuda")[:4096]
    fresh = torch.randn(4096, kv, d, device="cuda", dtype=torch.float16) * torch.rand(4096, kv, 1, device="cuda")
    torch_pool, torch_scale = _stored_on_cpu(k_pool, k_scale, new_rows, fresh, block)
    store_scaled(k_pool, k_scale, new_rows, fresh, block)
    assert k_pool.view(torch.uint8).ne(torch_pool.view(torch.uint8)).sum().item() <= fresh.numel() * 1e-3
    assert torch.allclose(k_scale, torch_scale, rtol=1e-6, atol=0)


def _stored_on_cpu(pool, scale, rows, values, block):
    """What the torch path stores on the host: ``oasr.layers.kv_format.store`` (CUDA takes the kernel)."""
    pool, scale = pool.cpu(), scale.cpu()
    kv_format.store(pool, scale, rows.cpu(), values.cpu(), block)
    return pool.cuda(), scale.cuda()


@pytest.mark.gpu
def test_tiny_en_with_an_fp8_cache_on_cuda_keeps_its_wer(english_clips) -> None:
    """On CUDA the kernels store and read the e4m3 caches (under CUDA graphs); the words stay those of the
    float16 cache."""
    entries, audio = english_clips
    loaded = from_pretrained("tiny.en", device="cuda", dtype="float16")
    full, fp8 = transcribe(loaded, audio, "auto"), transcribe(loaded, audio, "fp8")
    references = [e["text"] for e in entries]
    wer_full = word_error_rate(references, [loaded.tokenizer.decode(t) for t in full]).wer
    wer_fp8 = word_error_rate(references, [loaded.tokenizer.decode(t) for t in fp8]).wer
    same = sum(a == b for a, b in zip(full, fp8, strict=True))
    print(f"tiny.en on CUDA, {len(full)} clips: WER {wer_full:.4f} (float16 cache) {wer_fp8:.4f} (fp8), same {same}")
    assert wer_fp8 <= wer_full + 0.01, (wer_full, wer_fp8)
