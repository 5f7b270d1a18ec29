"""Quantization at the layer waist: a method registry and the spec a quantized checkpoint carries.

A method (``QUANT_METHODS``) quantizes the weights of every ``Linear`` a spec names, and the layer then runs the
method's GEMM: activations quantized per token as they arrive, weights stored quantized per output channel. The
waist is shared by every architecture, so every architecture can be quantized; a model declares only which norms
feed which GEMMs (``ModelCapabilities.smooth_groups``), for SmoothQuant. This package imports no torch until a
method is looked up. See docs/quantization.md.
"""

from __future__ import annotations

from oasr.quantization.spec import DEFAULT_ALPHA, QuantizationSpec, SmoothGroup, Smoothing
from oasr.registry import Registry

QUANT_METHODS: Registry[type] = Registry(
    "quantization method",
    lazy={
        "fp8": "oasr.quantization.fp8",
        "int8": "oasr.quantization.int8",
    },
)

__all__ = ["DEFAULT_ALPHA", "QUANT_METHODS", "QuantizationSpec", "SmoothGroup", "Smoothing"]
