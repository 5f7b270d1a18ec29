"""Triton kernels for the layer waist, each with a torch reference and an equivalence test.

``KERNELS`` maps a waist op (a module's ``KERNEL_OP``) to the waist ops its kernel absorbs: under the ``kernels``
backend such a module runs its kernel, and the modules it absorbs are not gaps. Every other op is a declared
gap, and so is an op whose kernel covers only part of it: they are listed here so that ``oasr models`` and the
``kernels`` backend can say exactly what still runs on torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

# The formats a decoder's K/V caches are held in (``CacheConfig.kv_cache_dtype``): "auto" in the model's dtype,
# "fp8" in float8 e4m3 with a scale per position and head, which the cache kernels store and read
# (``kv_store``, ``paged_attention``; the torch definitions are ``oasr.layers.kv_format``'s). Named here, in a
# module without torch, so a configuration checks a name without loading torch (``oasr.engine.config``).
KV_CACHE_DTYPES = ("auto", "fp8")


@dataclass(frozen=True)
class KernelGap:
    """An op of the waist that the ``kernels`` backend does not accelerate yet (``oasr.layers.backend`` reports
    the gaps a model hits; it is declared here, beside the kernels, so the waist imports the kernels and never
    the other way round)."""

    op: str
    reason: str


# conformer_conv: padding mask, depthwise convolution, batch norm and activation of a Conformer convolution
# module in one pass after torch's GLU (oasr.kernels.conformer_conv).
# layer_norm: a residual add and the LayerNorm after it (LayerNorm.add_forward; oasr.kernels.layer_norm).
# rms_norm: RMSNorm after its residual add in one pass (RMSNorm.add_forward), and per head with the rotary
# rotation after it (GroupedQueryAttention's q/k norms; oasr.kernels.rms_norm).
# paged_attention: a decoder's self-attention for one new token per row over the engine's paged pool, with the
# new key and value stored in the same pass, grouped key/value heads included (CachedSelfAttention,
# GroupedQueryAttention; oasr.kernels.paged_attention).
# paged_cross_attention: a decoder's attention for one new token per row to its encoder positions, read in place
# from the engine's paged cross-attention pool (CrossAttention; oasr.kernels.paged_attention).
# conv_subsampling: FastConformer's strided 2-D convolutions and their ReLUs, channels last, the first conv fused
# into the first depthwise conv (oasr.kernels.subsampling); its pointwise convs are matrix multiplies.
# gated_mlp: a SiLU-gated feed-forward block's gate, silu(gate) * up, in one pass (GatedMLP; oasr.kernels.gated);
# its projections are matrix multiplies.
# rel_pos_attention: the Transformer-XL position term shifted, biased with v and masked into SDPA's float mask in
# one pass (oasr.kernels.rel_position); the attention itself stays SDPA, so the op is also listed among the gaps.
KERNELS: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "conformer_conv": ("conv1d", "batch_norm", "silu", "relu"),
    "layer_norm": (),
    "rms_norm": (),
    "paged_attention": (),
    "paged_cross_attention": (),
    "conv_subsampling": ("conv2d", "relu"),
    "rel_pos_attention": (),
    "gated_mlp": ("silu",),
})

DECLARED_GAPS: tuple[KernelGap, ...] = (
    KernelGap("layer_norm", "a LayerNorm without a residual add before it (or outside add_forward) runs on torch"),
    KernelGap("linear", "cuBLAS through torch is already near the matmul ceiling; fused bias+GELU epilogue not written"),
    KernelGap("conv1d", "encoder front convolutions run through cuDNN"),
    KernelGap("embedding", "token + position embedding gather not fused"),
    KernelGap("gelu", "fused into no epilogue yet"),
    KernelGap("attention", "encoder self-attention and cross-attention run on SDPA (flash, cuDNN or efficient)"),
    KernelGap("conv2d", "covered inside conv_subsampling only; any other 2-D convolution runs through cuDNN"),
    KernelGap("batch_norm", "folded into the depthwise convolution inside conformer_conv only"),
    KernelGap("lstm", "transducer prediction network steps run through cuDNN's LSTM"),
    KernelGap("relu", "fused inside conformer_conv and conv_subsampling only"),
    KernelGap("silu", "fused inside conformer_conv and a gated MLP's gate only"),
    KernelGap("glu", "torch's GLU pass; conformer_conv gates before its kernel (per tap inside it measured slower)"),
    KernelGap("rel_pos_attention", "only the position term has a kernel (rel_pos_attention, above); the attention "
              "itself runs on SDPA with it as the float mask"),
)
