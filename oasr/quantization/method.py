"""What every quantization method provides, and the GEMM a quantized ``Linear`` runs.

A method turns a float weight [N, K] into its storage dtype with one float32 scale per output channel, and an
activation [M, K] into the same dtype with one scale per row (token), computed as it arrives. Its ``reference``
lane dequantizes and multiplies in float32: the oracle every device kernel is tested against, and what serves a
device without one. ``bind`` picks a lane for a device once, when the model is placed, and refuses a device the
method cannot serve, naming it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from oasr.errors import UnsupportedQuantizationError
from oasr.kernels import w8a8

# Float dtypes a quantized layer's activations may arrive in; its output comes back in the same dtype.
SERVED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# Rows whose largest magnitude is below this are scaled as if it were this (an all-zero row stays zero).
_MIN_AMAX = w8a8.MIN_AMAX  # the kernel floors its scales alike


class QuantMethod(ABC):
    """One quantization scheme. Subclasses are registered in ``QUANT_METHODS`` and hold no state."""

    name: ClassVar[str]
    storage_dtype: ClassVar[torch.dtype]
    qmax: ClassVar[float]  # the largest magnitude of the storage dtype that scales map to
    smooths: ClassVar[bool]  # whether quantizing a checkpoint folds SmoothQuant factors in by default

    def _scale(self, values: torch.Tensor, dim: int) -> torch.Tensor:
        # A multiply by the reciprocal: torch's CUDA division by a scalar is one, its CPU division is not, and the
        # scales must be the same on both (and in the device kernel).
        return values.abs().amax(dim=dim, keepdim=True).clamp(min=_MIN_AMAX) * (1.0 / self.qmax)

    @abstractmethod
    def _cast(self, scaled: torch.Tensor) -> torch.Tensor:
        """float32 values already divided by their scale -> the storage dtype (rounded and saturated)."""

    def quantize_weight(self, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """weight [N, K] -> (quantized [N, K], float32 scale [N]): one scale per output channel."""
        w = weight.detach().float()
        scale = self._scale(w, 1)
        return self._cast(w / scale), scale.flatten()

    def quantize_activation(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [M, K] -> (quantized [M, K], float32 scale [M, 1]): one scale per row, computed now (dynamic)."""
        xf = x.float()
        scale = self._scale(xf, 1)
        # Times the scale's (correctly rounded) reciprocal, as the device kernel does (one division per row there,
        # not one per value), so that both give the same bits.
        return self._cast(xf * scale.reciprocal()), scale

    def quantize_activation_fused(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``quantize_activation`` in one kernel where Triton runs (the device lanes), with the same numbers.
        Inside ``torch.compile`` it stays torch's ops, which the compiler fuses into the op that produced ``x``
        (the LayerNorm before a projection, the head transpose before ``out_proj``): the activation is then never
        written in its float dtype at all. (The compiler's division may round a last bit differently.)"""
        if w8a8.supported(x, self.storage_dtype) and not torch.compiler.is_compiling():
            return w8a8.quantize_rows(x, self.storage_dtype, self.qmax)
        return self.quantize_activation(x)

    def reference(self, x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None,
                  float_weight: torch.Tensor | None = None) -> torch.Tensor:
        """The dequantize-and-multiply oracle: x [M, K] (any float dtype), weight [N, K] quantized, scale [N]
        -> [M, N] in x's dtype. The activation is quantized per token exactly as the device kernels quantize it
        (inside ``torch.compile`` the device lanes may round a value one step apart: ``quantize_activation_fused``),
        so this lane's numbers are theirs up to the order of float32 accumulation. ``float_weight``: the
        weight's values already in float32 (a copy the layer keeps), else converted here."""
        return self.reference_quantized(self.quantize_activation(x), weight, scale, bias, x.dtype, float_weight)

    def reference_quantized(self, quantized: tuple[torch.Tensor, torch.Tensor], weight: torch.Tensor,
                            scale: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype,
                            float_weight: torch.Tensor | None = None) -> torch.Tensor:
        """``reference`` from an activation already quantized (values [M, K], scales [M, 1]) -> [M, N] in ``dtype``."""
        qx, sx = quantized
        out = (qx.float() @ (weight.float() if float_weight is None else float_weight).t()) * sx * scale
        if bias is not None:
            out = out + bias.float()
        return out.to(dtype)

    # The device lane, declared by each method: the torch op it calls, the compute capability it needs (and what to
    # say to a device below it), and the multiple its operands' dimensions must be (a layer of another shape runs
    # the reference lane).
    fast_lane: ClassVar[str]
    torch_op: ClassVar[str]
    min_capability: ClassVar[tuple[int, int]]
    below_capability: ClassVar[str]  # the end of the refusal for a device below it ("{}": the minimum capability)
    shape_multiple: ClassVar[int]

    def lane_for(self, device: torch.device, weight_shape: tuple[int, ...]) -> str:
        """The lane serving a layer of ``weight_shape`` on ``device``: the reference on the CPU, the method's
        device lane on CUDA; raises ``UnsupportedQuantizationError`` for a device the method cannot serve."""
        major, minor = self.min_capability
        if device.type == "cpu":
            return "reference"
        if device.type != "cuda":
            raise self.refuse(device, f"it runs on CUDA (compute capability {major}.{minor} or newer) or on the CPU")
        if not hasattr(torch, self.torch_op):
            raise self.refuse(device, f"this torch build ({torch.__version__}) has no torch.{self.torch_op}")
        capability = cuda_capability(device)
        if capability < self.min_capability:
            raise self.refuse(device, f"{torch.cuda.get_device_name(device)} is compute capability "
                              f"{capability[0]}.{capability[1]}; {self.below_capability.format(f'{major}.{minor}')}")
        n, k = weight_shape
        return self.fast_lane if n % self.shape_multiple == 0 and k % self.shape_multiple == 0 else "reference"

    def run(self, lane: str, x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
            bias: torch.Tensor | None) -> torch.Tensor:
        """x [M, K] through ``lane`` -> [M, N] in x's dtype."""
        return self.run_quantized(lane, self.quantize_for(lane, x), weight, scale, bias, x.dtype)

    def quantize_for(self, lane: str, x: torch.Tensor, act: nn.Module | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """x [M, K] (through the activation module ``act`` first, if given) quantized as ``lane`` quantizes it:
        (values [M, K], float32 scales [M, 1]). Every lane of a method gives the same numbers; the device lanes
        take the one-pass kernel. After an activation they take it inside ``torch.compile`` too: fused there with
        a GELU over large-v3's 5,120-wide MLP rows, torch's quantization ran 2.1 ms against 0.75 ms for the GELU
        and 0.63 ms for the kernel apart (H200, 96,000 rows)."""
        if act is not None:
            x = act(x)
            if lane != "reference" and w8a8.supported(x, self.storage_dtype):
                return w8a8.quantize_rows(x, self.storage_dtype, self.qmax)
        return self.quantize_activation(x) if lane == "reference" else self.quantize_activation_fused(x)

    def run_quantized(self, lane: str, quantized: tuple[torch.Tensor, torch.Tensor], weight: torch.Tensor,
                      scale: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
        """An activation from ``quantize_for`` through ``lane``'s GEMM -> [M, N] in ``dtype``."""
        if lane == "reference":
            return self.reference_quantized(quantized, weight, scale, bias, dtype)
        raise ValueError(f"{self.name}: unknown lane {lane!r}")

    def check_device(self, device: torch.device) -> None:
        """Raises ``UnsupportedQuantizationError`` naming ``device`` if the method cannot serve it."""
        self.lane_for(torch.device(device), (0, 0))

    def bind(self, device: torch.device, weight_shape: tuple[int, ...]) -> QuantizedGemm:
        return QuantizedGemm(self, self.lane_for(torch.device(device), weight_shape))

    def refuse(self, device: torch.device, why: str) -> UnsupportedQuantizationError:
        return UnsupportedQuantizationError(f"quantization method {self.name!r} cannot serve device {device}: {why}")


def check_dtype(method: QuantMethod, dtype: torch.dtype) -> None:
    if dtype not in SERVED_DTYPES:
        served = ", ".join(str(d).removeprefix("torch.") for d in SERVED_DTYPES)
        raise UnsupportedQuantizationError(f"quantization method {method.name!r} cannot serve dtype "
                                           f"{str(dtype).removeprefix('torch.')} (it serves {served})")


def cuda_capability(device: torch.device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device)


@dataclass(frozen=True)
class QuantizedGemm:
    """What a quantized ``Linear`` runs: its method and the lane chosen for its device."""

    method: QuantMethod
    lane: str

    def __call__(self, x: torch.Tensor, layer, act: nn.Module | None = None) -> torch.Tensor:
        """x [..., K] (through ``act`` first, if given) through ``layer``'s quantized weight -> [..., N] in x's
        dtype."""
        out = self.multiply(self.quantize(x.reshape(-1, x.shape[-1]), act), layer, x.dtype)
        return out.view(*x.shape[:-1], out.shape[-1])

    @property
    def activation_key(self) -> tuple[str, str]:
        """What decides how this GEMM quantizes its input: layers with equal keys may share one quantization of
        it (``oasr.layers.SharedInput``). Scales are computed per token from the input alone; a method that kept
        activation state per layer (static, calibrated scales) would have to add it here."""
        return self.method.name, self.lane

    def quantize(self, rows: torch.Tensor, act: nn.Module | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """rows [M, K] (through ``act`` first, if given) as this lane's GEMM takes them: (values, scales [M, 1]).
        Layers bound to the same method and lane can share one (``oasr.layers.SharedInput``)."""
        return self.method.quantize_for(self.lane, rows, act)

    def multiply(self, quantized: tuple[torch.Tensor, torch.Tensor], layer, dtype: torch.dtype) -> torch.Tensor:
        """A quantized activation [M, K] through ``layer``'s weight -> [M, N] in ``dtype``. On the reference lane
        the layer keeps its weight's values in float32 once used (made again only if the weight moves): the
        oracle lane trades the memory saving for not converting the weight on every call, which dominates a
        decode step of a few rows."""
        if self.lane == "reference":
            from oasr.layers.basic import derived

            float_weight = derived(layer, "_float_weight", (layer.weight,), layer.weight.float)
            return self.method.reference_quantized(quantized, layer.weight, layer.weight_scale, layer.bias, dtype,
                                                   float_weight)
        return self.method.run_quantized(self.lane, quantized, layer.weight, layer.weight_scale, layer.bias, dtype)
