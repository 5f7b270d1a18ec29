"""Decode-step attention over the paged pool: the Triton kernel against its torch reference (interpreter on CPU,
native on CUDA), and the reference against the engine's general torch path."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

from oasr.engine.kv_cache import PagedKVPool, paged_context
from oasr.models.base import CrossSpec, DecoderSpec
from oasr.kernels.paged_attention import paged_decode_attention, paged_decode_attention_reference
from cross_projector import Projector
from test_kernels import worst_error_interpreted

_INTERPRETED = textwrap.dedent("""
    import torch
    from oasr.kernels.paged_attention import paged_decode_attention, paged_decode_attention_reference, supported
    torch.manual_seed(0)
    worst = 0.0
    # First position, a block's first slot, the table's last slot, mid-block; tiles smaller and larger than blocks;
    # as many key/value heads as query heads, and fewer (each serving 2 or 3 query heads).
    for b, h, kv, d, block_size, nb in [(4, 3, 3, 16, 4, 3), (3, 2, 2, 32, 16, 2), (2, 1, 1, 64, 8, 5),
                                        (4, 4, 2, 16, 4, 3), (3, 6, 2, 32, 16, 2)]:
        k_pool = torch.randn((1 + b * nb) * block_size, kv, d)
        v_pool = torch.randn_like(k_pool)
        table = (1 + torch.randperm(b * nb)).view(b, nb)
        positions = torch.tensor([0, block_size, nb * block_size - 1, block_size // 2 + 1][:b])
        if b == 2:  # a prompt's one position for every row, as an expanded view (stride 0)
            positions = torch.tensor([3]).expand(b)
        q, k, v = torch.randn(b, h, d), torch.randn(b, kv, d), torch.randn(b, kv, d)
        assert supported(q)
        pools = (k_pool.clone(), v_pool.clone())
        got = paged_decode_attention(q, k, v, *pools, table, positions, block_size)
        want = paged_decode_attention_reference(q, k, v, k_pool, v_pool, table, positions, block_size)
        worst = max(worst, (got - want).abs().max().item(), (pools[0] - k_pool).abs().max().item(),
                    (pools[1] - v_pool).abs().max().item())
    print(worst)
""")


def test_paged_decode_attention_kernel_equals_its_reference_in_the_interpreter() -> None:
    assert worst_error_interpreted(_INTERPRETED) < 1e-5


def filled_pool(layers: int, heads: int, dim: int, block_size: int, blocks: int, device: str = "cpu",
                dtype: torch.dtype = torch.float32, kv_heads: int | None = None) -> PagedKVPool:
    spec = DecoderSpec(layers, heads, kv_heads or heads, dim, blocks * block_size, CrossSpec(max_len=1, fixed=False))
    pool = PagedKVPool(spec, blocks, block_size, dtype, torch.device(device))  # the self-attention pool only
    pool.k.normal_()
    pool.v.normal_()
    return pool


@pytest.mark.parametrize("heads,kv_heads", [(3, 3), (6, 2)])
def test_the_reference_is_what_the_engine_computes_on_torch(heads: int, kv_heads: int) -> None:
    """A decode step through ``PagedContext`` on CPU (the general gather + SDPA path) writes and returns what
    the reference does, so the kernel's reference is the engine's own arithmetic; with grouped key/value heads
    too."""
    torch.manual_seed(1)
    pool = filled_pool(2, heads, 8, 4, 9, kv_heads=kv_heads)
    table = torch.tensor([[3, 5], [7, 1], [2, 8], [0, 0]])  # the last row idle, on the null block
    positions = torch.tensor([5, 0, 7, 2])
    q = torch.randn(4, heads, 1, 8)
    k, v = (torch.randn(4, kv_heads, 1, 8) for _ in range(2))
    reference_pools = (pool.k[1].clone(), pool.v[1].clone())
    got = paged_context(pool, table, positions[:, None]).attend(1, q, k, v)[:, :, 0]
    want = paged_decode_attention_reference(q[:, :, 0], k[:, :, 0], v[:, :, 0], *reference_pools, table,
                                            positions, 4)
    assert torch.allclose(got, want, atol=1e-6)
    assert torch.equal(pool.k[1], reference_pools[0]) and torch.equal(pool.v[1], reference_pools[1])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("h,kv,d", [(20, 20, 64), (16, 8, 128)])  # Whisper large's heads; Qwen3-1.7B's groups
def test_paged_decode_attention_kernel_equals_its_reference_on_cuda(dtype: torch.dtype, h: int, kv: int,
                                                                   d: int) -> None:
    torch.manual_seed(0)
    b, block_size, nb = 64, 16, 28
    pool = filled_pool(1, h, d, block_size, 1 + b * nb, "cuda", dtype, kv_heads=kv)
    table = (1 + torch.randperm(b * nb, device="cuda")).view(b, nb)
    positions = torch.randint(0, nb * block_size, (b,), device="cuda")
    q = torch.randn(b, h, d, device="cuda", dtype=dtype)
    k, v = (torch.randn(b, kv, d, device="cuda", dtype=dtype) for _ in range(2))
    tolerance = 1e-5 if dtype == torch.float32 else 2e-3
    # Decode-step positions, then a prompt's one position shared by every row (an expanded view).
    for positions in (positions, torch.full((1,), 5, device="cuda").expand(b)):
        pools = (pool.k[0].clone(), pool.v[0].clone())
        got = paged_decode_attention(q, k, v, *pools, table, positions, block_size)
        want = paged_decode_attention_reference(q, k, v, pool.k[0], pool.v[0], table, positions, block_size)
        assert (got.float() - want.float()).abs().max().item() < tolerance
        assert torch.equal(pools[0], pool.k[0]) and torch.equal(pools[1], pool.v[0])


_CROSS_INTERPRETED = textwrap.dedent("""
    import torch
    from oasr.kernels.paged_attention import paged_cross_attention, paged_cross_attention_reference
    torch.manual_seed(0)
    worst = 0.0
    # Lengths: a whole table, one position, mid-block, none (an idle slot); tiles smaller and larger than blocks;
    # each head in a program of its own, and two or four adjacent heads read together, split or not.
    for b, h, d, block_size, nb in [(4, 3, 16, 4, 3), (3, 2, 32, 16, 2), (2, 1, 64, 8, 5), (4, 4, 16, 8, 3)]:
        k_pool = torch.randn((1 + b * nb) * block_size, h, d)
        v_pool = torch.randn_like(k_pool)
        table = (1 + torch.randperm(b * nb)).view(b, nb)
        lengths = torch.tensor([nb * block_size, 1, block_size + block_size // 2, 0][:b])
        q = torch.randn(b, h, d)
        want = paged_cross_attention_reference(q, k_pool, v_pool, table, lengths, block_size)
        for group in (1, 2, 4):
            if h % group == 0:
                for splits in (1, 2):
                    got = paged_cross_attention(q, k_pool, v_pool, table, lengths, block_size,
                                                heads_per_program=group, splits=splits)
                    worst = max(worst, (got - want).abs().max().item())
    print(worst)
""")


def test_paged_cross_attention_kernel_equals_its_reference_in_the_interpreter() -> None:
    assert worst_error_interpreted(_CROSS_INTERPRETED) < 1e-5


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_paged_cross_reads_what_dense_cross_attention_reads(kv_cache_dtype: str) -> None:
    """The engine's paged cross-attention store, written from a batch of different encoder lengths, attends as
    dense cross-attention with a length mask does; beams of one request share its blocks. In e4m3, dense
    attention over the values as rounded (``oasr.layers.kv_format``)."""
    from oasr.engine.cross_cache import PagedCrossStore
    from oasr.engine.step import EncodeRow
    from oasr.layers.cache import DenseCross
    from oasr.layers.kv_format import KVFormat, dequantize_heads, quantize_heads

    torch.manual_seed(2)
    layers, heads, dim, block = 2, 2, 4, 4
    spec = DecoderSpec(layers, heads, heads, dim, 16, CrossSpec(max_len=12, fixed=False))
    store = PagedCrossStore(spec, num_blocks=12, block_size=block, num_slots=5,
                            fmt=KVFormat(kv_cache_dtype, torch.float32), device=torch.device("cpu"))
    hidden = torch.randn(2, 10, heads * dim)
    lengths = torch.tensor([10, 3])
    rows = (EncodeRow("a", (3,), ((),), (5, 2, 9)), EncodeRow("b", (0, 4), ((), ()), (7,)))
    store.write(Projector(), rows, hidden, lengths.tolist())  # host ints, as the engine passes them
    k = torch.stack([(hidden * (i + 1)).unflatten(-1, (heads, dim)) for i in range(layers)])  # [L, B, S, H, D]
    if kv_cache_dtype == "fp8":  # e4m3 rounds -x as it rounds x
        k = dequantize_heads(*quantize_heads(k), torch.float32)
    k = k.transpose(2, 3)
    dense = DenseCross(k, -k, lengths)
    q = torch.randn(2, heads, 1, dim)
    for layer in range(layers):
        want = dense.attend(layer, q)
        for slot, row in ((3, 0), (0, 1), (4, 1)):
            got = store.context(5).attend(layer, q[row : row + 1].expand(5, -1, -1, -1))[slot]
            assert torch.allclose(got, want[row], atol=1e-6), (layer, slot)
    store.release([3])
    assert store.lengths[3] == 0 and store.table[3].eq(0).all()


_SLOT_STEP_INTERPRETED = textwrap.dedent(f"""
    import sys
    import torch
    from oasr.engine.cross_cache import SlotCrossStore
    from oasr.engine.step import EncodeRow
    from oasr.models.base import CrossSpec, DecoderSpec

    sys.path.insert(0, {str(Path(__file__).parent)!r})
    from cross_projector import Projector

    torch.manual_seed(4)
    layers, heads, dim, window = 2, 2, 16, 6
    spec = DecoderSpec(layers, heads, heads, dim, 16, CrossSpec(max_len=window, fixed=True))
    store = SlotCrossStore(spec, 5, torch.float32, torch.device("cpu"), kernel_min_head_rows=5 * heads)
    hidden = torch.randn(2, window, heads * dim)
    rows = (EncodeRow("a", (3,), ((),)), EncodeRow("b", (0, 4), ((), ())))  # slots: 0 b, 1 -, 2 -, 3 a, 4 b
    store.write(Projector(), rows, hidden, [window, window])
    q = torch.randn(5, heads, 1, dim)
    worst = 0.0
    for released in ((), (4,)):
        store.release(list(released))
        step = store.context(5)
        for layer in range(layers):
            dense = step.attend(layer, q)  # SDPA over every slot, idle ones too
            kernel = step.attend(layer, q, use_kernel=True)
            live = torch.tensor([s not in (1, 2) + released for s in range(5)])
            worst = max(worst, (kernel[live] - dense[live]).abs().max().item(), kernel[~live].abs().max().item())
    assert store.context(4).paged is None  # 4 rows x 2 heads, below kernel_min_head_rows: SDPA over every slot
    print(worst)
""")


def test_a_window_slot_step_on_the_kernel_reads_the_live_slots_and_skips_the_idle_ones() -> None:
    """Whisper's fixed-window slots (float): a decode step of at least ``kernel_min_head_rows`` rows x heads on the
    paged kernel attends each live slot as SDPA over the slots does, and reads nothing of a slot no request holds,
    never written or released (zeros out); a smaller step stays on SDPA."""
    assert worst_error_interpreted(_SLOT_STEP_INTERPRETED) < 1e-5


def test_an_idle_slot_reads_zeros_on_the_torch_path_whatever_sdpa_gives_an_all_masked_row(monkeypatch) -> None:
    """Some SDPA backends give NaN for a row whose every position is masked (an idle slot's, length 0); the torch
    path gives zeros there, as the kernel does, so nothing NaN reaches the null block that live rows read masked.
    The test's SDPA is the textbook softmax, NaN on an all-masked row."""
    import oasr.engine.cross_cache as cross_cache
    from oasr.engine.cross_cache import SlotCrossStore
    from oasr.engine.step import EncodeRow
    from oasr.layers.kv_format import KVFormat

    def textbook(q, k, v, mask=None):
        scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
        return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ v

    monkeypatch.setattr(cross_cache, "sdpa", textbook)
    heads, dim, window = 2, 16, 6
    spec = DecoderSpec(2, heads, heads, dim, 16, CrossSpec(max_len=window, fixed=True))
    store = SlotCrossStore(spec, 3, KVFormat("fp8", torch.float32), torch.device("cpu"))
    store.write(Projector(), (EncodeRow("a", (1,), ((),)),), torch.randn(1, window, heads * dim), [window])
    out = store.context(3).attend(0, torch.randn(3, heads, 1, dim))
    assert out[1].abs().sum() > 0 and torch.isfinite(out).all()
    assert out[0].eq(0).all() and out[2].eq(0).all()
