"""The layer waist: every model in OASR is built from these modules and nothing else.

Keeping models on one narrow set of layers is what lets a kernel (``oasr.kernels``) or a quantization method
(later ``oasr.quantization``) change every architecture at once. ``tests/test_registries.py`` walks each
registered architecture and fails on any bare ``torch.nn`` layer.
"""

from oasr.layers.attention import CachedSelfAttention, CrossAttention, MultiHeadAttention, sdpa
from oasr.layers.backend import BACKENDS, Backend, KernelGap, apply_backend, kernel_gaps
from oasr.layers.basic import (
    GELU,
    GLU,
    LSTM,
    BatchNorm1d,
    Conv1d,
    Conv2d,
    Embedding,
    Float32Head,
    LayerNorm,
    Linear,
    PointwiseConv1d,
    ReLU,
    SiLU,
    activation,
)
from oasr.layers.gated_mlp import GatedMLP
from oasr.layers.grouped_attention import GroupedQueryAttention
from oasr.layers.norms import RMSNorm
from oasr.layers.positions import SinusoidalPositions
from oasr.layers.rotary import RotaryEmbedding, apply_rotary
from oasr.layers.shared_input import SharedInput
from oasr.layers.rel_attention import (
    RelPositionMultiHeadAttention,
    relative_position_embeddings,
)

__all__ = [
    "BACKENDS",
    "GELU",
    "GLU",
    "GatedMLP",
    "GroupedQueryAttention",
    "LSTM",
    "Backend",
    "BatchNorm1d",
    "CachedSelfAttention",
    "Conv1d",
    "Conv2d",
    "CrossAttention",
    "Embedding",
    "Float32Head",
    "KernelGap",
    "LayerNorm",
    "Linear",
    "MultiHeadAttention",
    "PointwiseConv1d",
    "RMSNorm",
    "ReLU",
    "RelPositionMultiHeadAttention",
    "RotaryEmbedding",
    "SharedInput",
    "SiLU",
    "SinusoidalPositions",
    "activation",
    "apply_backend",
    "apply_rotary",
    "kernel_gaps",
    "relative_position_embeddings",
    "sdpa",
]
