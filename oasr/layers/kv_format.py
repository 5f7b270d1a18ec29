"""How the engine's decoder caches (``oasr.engine.kv_cache``, ``oasr.engine.cross_cache``) hold keys and values:
in the model's dtype (``auto``), or in float8 e4m3 with a float32 scale per position and head (``fp8``;
``CacheConfig.kv_cache_dtype``).

Every cache is a set of blocks: data [rows, H, D] per layer, where row = block * block_size + offset (the paged
pools; a fixed-window cross-attention slot is one block of the window's length). An fp8 cache adds scale
[blocks, H, block_size] per layer, so a walk over one head's positions reads its scales contiguously. A scale
is the row's largest magnitude over 448 (e4m3's largest finite value): each (position, head) uses the whole
range, whatever the layer's spread. fp8 halves the bytes a decode step reads from the caches (plus 4 bytes per
head of 64 or 128 values), and the room a request takes; the values lose the low bits of their mantissas.

``quantize_heads`` / ``dequantize_heads`` are the torch definitions; the Triton kernels (``oasr.kernels.kv_store``
for a batch's new positions, ``oasr.kernels.paged_attention`` for a decode step's token and for reading) compute
the same numbers where they store or read a cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from oasr.errors import UnsupportedOptionError
from oasr.kernels import KV_CACHE_DTYPES

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
_FP8_CAPABILITY = (8, 9)
_TINY = 1e-12  # the scale of an all-zero row: its values stay zero


@dataclass(frozen=True)
class KVFormat:
    """``name``: one of ``KV_CACHE_DTYPES``; ``compute_dtype``: the model's dtype (what attention reads)."""

    name: str
    compute_dtype: torch.dtype

    @property
    def scaled(self) -> bool:
        return self.name == "fp8"

    @property
    def storage_dtype(self) -> torch.dtype:
        return FP8 if self.scaled else self.compute_dtype

    def position_bytes(self, heads: int, head_dim: int) -> int:
        """Bytes one position of one layer's keys (or values) takes."""
        return heads * head_dim * self.storage_dtype.itemsize + (heads * 4 if self.scaled else 0)


def as_format(fmt: KVFormat | torch.dtype) -> KVFormat:
    """A format, or a bare dtype as the unscaled format of that dtype."""
    return fmt if isinstance(fmt, KVFormat) else KVFormat("auto", fmt)


def format_for(name: str, dtype: torch.dtype, device: torch.device) -> KVFormat:
    """The format ``name`` for a model of ``dtype`` on ``device``, or a refusal naming what is missing."""
    if name not in KV_CACHE_DTYPES:
        raise UnsupportedOptionError(f"unknown kv_cache_dtype {name!r}; choose one of {', '.join(KV_CACHE_DTYPES)}")
    if name == "fp8" and device.type == "cuda":
        capability = torch.cuda.get_device_capability(device)
        if capability < _FP8_CAPABILITY:
            raise UnsupportedOptionError(
                f"kv_cache_dtype fp8 needs a GPU of compute capability {_FP8_CAPABILITY[0]}.{_FP8_CAPABILITY[1]} or "
                f"newer (Ada, Hopper); {torch.cuda.get_device_name(device)} is {capability[0]}.{capability[1]}")
    elif name == "fp8" and device.type != "cpu":
        raise UnsupportedOptionError(f"kv_cache_dtype fp8 runs on CUDA and the CPU, not on {device.type}")
    return KVFormat(name, dtype)


def quantize_heads(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [..., H, D] -> (e4m3 values [..., H, D], float32 scales [..., H]); x ~ values * scale."""
    amax = x.float().abs().amax(-1)
    scale = amax.clamp(min=_TINY) * (1.0 / FP8_MAX)
    values = (x.float() * (1.0 / scale)[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return values, scale


def dequantize_heads(values: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The inverse of ``quantize_heads``: values [..., H, D], scale [..., H] -> [..., H, D] in ``dtype``."""
    return (values.float() * scale[..., None]).to(dtype)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """An e4m3 tensor as its bytes (index copies are not implemented for float8); others as they are."""
    return t.view(torch.uint8) if t.dtype == FP8 else t


def _scale_index(rows: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.div(rows, block_size, rounding_mode="floor"), rows % block_size


def store(data: torch.Tensor, scale: torch.Tensor | None, rows: torch.Tensor, values: torch.Tensor,
          block_size: int) -> None:
    """values [..., N, H, D] into ``rows`` [N] of data [..., rows, H, D] (one layer, or every layer with the same
    leading dims), quantized where the cache is scaled (``scale``: [..., blocks, H, block_size])."""
    dim = data.dim() - 3
    if scale is None:
        data.index_copy_(dim, rows, values.to(data.dtype))
        return
    from oasr.kernels import kv_store  # here: oasr.kernels imports the layers
    from oasr.kernels.runtime import per_head_kernel_runs_on

    if values.is_cuda and per_head_kernel_runs_on(values):  # one pass per layer instead of seven
        for layer_data, layer_scale, layer_values in zip(data, scale, values) if dim else ((data, scale, values),):
            kv_store.store_scaled(layer_data, layer_scale, rows, layer_values, block_size)
        return
    quantized, scales = quantize_heads(values)
    _bytes(data).index_copy_(dim, rows, _bytes(quantized))
    block, offset = _scale_index(rows, block_size)
    if dim == 0:
        scale[block, :, offset] = scales
    else:  # every layer: the indexed dims come first in an advanced assignment
        scale[:, block, :, offset] = scales.transpose(0, 1)


def gather(data: torch.Tensor, scale: torch.Tensor | None, rows: torch.Tensor, block_size: int,
           dtype: torch.dtype) -> torch.Tensor:
    """One layer's positions at ``rows`` (any shape R) -> [*R, H, D] in ``dtype``, dequantized where scaled."""
    picked = data[rows]
    if scale is None:
        return picked
    block, offset = _scale_index(rows, block_size)
    return dequantize_heads(picked, scale[block, :, offset], dtype)


def copy_rows(data: torch.Tensor, scale: torch.Tensor | None, sources: torch.Tensor, targets: torch.Tensor,
              block_size: int) -> None:
    """Every layer's positions at ``sources`` [N] into ``targets`` [N] (all read before any is written)."""
    raw = _bytes(data)
    raw.index_copy_(1, targets, raw.index_select(1, sources))
    if scale is not None:
        source_block, source_offset = _scale_index(sources, block_size)
        target_block, target_offset = _scale_index(targets, block_size)
        scale[:, target_block, :, target_offset] = scale[:, source_block, :, source_offset]
