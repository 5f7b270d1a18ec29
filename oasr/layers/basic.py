"""Parameter-holding layers of the waist.

They keep torch's parameter names (``weight``, ``bias``) so checkpoints load by key, and each names the kernel
op that would replace its forward under the ``kernels`` backend (``KERNEL_OP``).
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol

import torch
import torch.nn.functional as F
from torch import nn


class QuantGemm(Protocol):
    """What a quantized ``Linear`` (and ``SharedInput``) calls on the GEMM its quantization method bound it to
    (``oasr.quantization.method.QuantizedGemm``). Declared here, where it is called, so the waist does not name
    the package built on it."""

    method: Any  # the quantization method: ``bind(device, shape)`` binds the layer again after a move

    def __call__(self, x: torch.Tensor, layer: nn.Module, act: nn.Module | None = None) -> torch.Tensor: ...

    @property
    def activation_key(self) -> tuple[str, str]: ...

    def quantize(self, rows: torch.Tensor, act: nn.Module | None = None) -> tuple[torch.Tensor, torch.Tensor]: ...

    def multiply(self, quantized: tuple[torch.Tensor, torch.Tensor], layer: nn.Module,
                 dtype: torch.dtype) -> torch.Tensor: ...


def tensor_key(t: torch.Tensor) -> tuple:
    """Identity and write count of ``t``, for caches derived from parameters. Inference tensors keep no write
    count (in-place writes to them are not tracked), so for them only storage and dtype tell a change."""
    try:
        version = t._version
    except RuntimeError:
        version = -1
    return t.data_ptr(), t.device, t.dtype, version


def derived(module: nn.Module, name: str, sources: tuple[torch.Tensor | None, ...], build):
    """``build()``, cached on ``module`` under ``name`` (outside the state dict) and made again only when one
    of ``sources`` moves or is written (``tensor_key``): a float32 weight copy, a folded batch norm."""
    key = tuple(tensor_key(t) for t in sources if t is not None)
    cached = module.__dict__.get(name)
    if cached is None or cached[0] != key:
        cached = (key, build())
        module.__dict__[name] = cached
    return cached[1]


class Linear(nn.Linear):
    """``nn.Linear``, and the GEMM kind that ``oasr.quantization`` quantizes.

    Quantized (``quant_gemm`` set), ``weight`` holds the method's storage (int8, float8) and the buffer
    ``weight_scale`` [out_features] its float32 per-channel scales; the layer then runs ``quant_gemm`` and returns
    its input's dtype. Moving the model moves those two but never casts them: ``model.to(float16)`` changes the
    bias and ``compute_dtype`` only, and a move to another device picks the method's lane for that device again
    (refusing a device the method cannot serve)."""

    KERNEL_OP: ClassVar[str] = "linear"
    QUANTIZABLE: ClassVar[bool] = True
    quant_gemm: QuantGemm | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gemm = self.quant_gemm
        if gemm is None:
            return F.linear(x, self.weight, self.bias)
        return gemm(x, self)

    def after(self, act: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """``self(act(x))``, an MLP's second GEMM after its activation. On a quantized layer's device lane act(x)
        goes to the method's quantization kernel even inside ``torch.compile``, where a plain call's quantization
        would be fused into the op before it (``QuantMethod.quantize_for`` says why)."""
        gemm = self.quant_gemm
        return self(act(x)) if gemm is None else gemm(x, self, act)

    @property
    def compute_dtype(self) -> torch.dtype:
        """The float dtype this layer computes in (its weight's, or the model's when the weight is quantized)."""
        return self.weight.dtype if self.quant_gemm is None else self.__dict__["_compute_dtype"]

    def set_quantized(self, gemm: QuantGemm, weight: torch.Tensor, scale: torch.Tensor) -> None:
        """Makes this layer quantized: ``weight`` [out, in] in the method's storage dtype, ``scale`` [out]."""
        if tuple(weight.shape) != (self.out_features, self.in_features) or tuple(scale.shape) != (self.out_features,):
            raise ValueError(f"quantized weight {tuple(weight.shape)} / scale {tuple(scale.shape)} do not fit "
                             f"Linear({self.in_features}, {self.out_features})")
        self.__dict__["_compute_dtype"] = self.compute_dtype
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.register_buffer("weight_scale", scale.float())
        self.quant_gemm = gemm

    def _apply(self, fn, recurse=True):
        gemm = self.quant_gemm
        if gemm is None:
            return super()._apply(fn, recurse)
        # Quantized storage and scales follow the model's device, never its dtype.
        weight, scale = self._parameters.pop("weight"), self._buffers.pop("weight_scale")
        try:
            super()._apply(fn, recurse)
        finally:
            target = fn(torch.empty(0, device=weight.device, dtype=self.__dict__["_compute_dtype"]))
            self._parameters["weight"] = nn.Parameter(weight.to(target.device), requires_grad=False)
            self._buffers["weight_scale"] = scale.to(target.device)
        self.__dict__["_compute_dtype"] = target.dtype
        if target.device != weight.device:
            self.quant_gemm = gemm.method.bind(target.device, tuple(weight.shape))
        return self


class Float32Head(Linear):
    """A vocabulary projection computed in float32 whatever the model's dtype.

    In half precision, near-tied logits (``.`` against ``?`` after a sentence) are decided by the projection's
    rounding; a float32 product over the same half-precision hidden state keeps greedy output on the float32
    path far more often. On CUDA the half-precision operands are multiplied with float32 accumulation and output;
    elsewhere through a float32 copy of the weight, made once (and again only if the weight moves or is written)
    and not part of the state dict. It is never quantized (``QUANTIZABLE``): its rounding is what it is for.
    """

    QUANTIZABLE: ClassVar[bool] = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        if weight.dtype != torch.float32 and x.is_cuda and self.__dict__.get("_mixed_mm", True):
            # Half-precision operands with float32 accumulation and output: the same exact products as the
            # float32 copy, read from half the bytes and on tensor cores. (torch.mm's out_dtype; older torch
            # builds lack it, and then the float32 copy below is used.)
            try:
                out = torch.mm(x.reshape(-1, x.shape[-1]).to(weight.dtype), weight.t(), out_dtype=torch.float32)
            except (RuntimeError, TypeError, NotImplementedError):
                self.__dict__["_mixed_mm"] = False
            else:
                out = out.view(*x.shape[:-1], -1)
                return out if self.bias is None else out + self.bias.float()
        if weight.dtype != torch.float32:
            weight = derived(self, "_float32_weight", (weight,), weight.detach().float)
        bias = None if self.bias is None else self.bias.float()
        return F.linear(x.float(), weight, bias)


class LayerNorm(nn.LayerNorm):
    """LayerNorm. ``add_forward`` is a pre-norm block's residual step, the add and the norm, which the
    ``kernels`` backend runs as one Triton pass (inside ``torch.compile`` it stays torch's, which the compiler
    fuses itself). A plain call stays torch's: for a few rows (a decode step) the kernel's launch costs more than
    it saves."""

    KERNEL_OP: ClassVar[str] = "layer_norm"
    use_kernel = False  # set by oasr.layers.apply_backend

    def add_forward(self, x: torch.Tensor, delta: torch.Tensor, alpha: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (s = x + alpha * delta, norm(s))."""
        from oasr.kernels import layer_norm

        if self.use_kernel and layer_norm.supported(x) and not torch.compiler.is_compiling():
            return layer_norm.add_layer_norm(x, delta, self.weight, self.bias, self.eps, alpha)
        s = torch.add(x, delta, alpha=alpha)
        return s, self(s)


class Conv1d(nn.Conv1d):
    KERNEL_OP: ClassVar[str] = "conv1d"


class PointwiseConv1d(nn.Conv1d):
    """A kernel-size-1 convolution applied to channel-last input [B, T, C_in] -> [B, T, C_out].

    It keeps a convolution's parameters (``weight`` [C_out, C_in, 1]) so checkpoints load by key, but runs as
    the matrix multiply it is, without moving channels in front of time and back.
    """

    KERNEL_OP: ClassVar[str] = "linear"

    def __init__(self, in_channels: int, out_channels: int, *, bias: bool = True) -> None:
        super().__init__(in_channels, out_channels, kernel_size=1, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight[:, :, 0], self.bias)


class Embedding(nn.Embedding):
    KERNEL_OP: ClassVar[str] = "embedding"


class GELU(nn.Module):
    """Exact (erf) GELU, as Whisper and most speech encoders were trained with."""

    KERNEL_OP: ClassVar[str] = "gelu"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x)


class Conv2d(nn.Conv2d):
    KERNEL_OP: ClassVar[str] = "conv2d"


class BatchNorm1d(nn.BatchNorm1d):
    """Inference-time batch norm: a per-channel affine from the running statistics (models run in eval mode)."""

    KERNEL_OP: ClassVar[str] = "batch_norm"


class LSTM(nn.LSTM):
    """Batch-first LSTM (transducer prediction networks); keeps torch's ``weight_ih_l0`` ... parameter names."""

    KERNEL_OP: ClassVar[str] = "lstm"


class ReLU(nn.Module):
    KERNEL_OP: ClassVar[str] = "relu"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x)


class SiLU(nn.Module):
    """SiLU (swish), the Conformer family's activation."""

    KERNEL_OP: ClassVar[str] = "silu"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(x)


class GLU(nn.Module):
    """Gated linear unit: splits ``dim`` in halves a, b and returns a * sigmoid(b)."""

    KERNEL_OP: ClassVar[str] = "glu"

    def __init__(self, dim: int = -1) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.glu(x, dim=self.dim)


def activation(name: str) -> nn.Module:
    """The waist module for an activation named as in Hugging Face configs (``hidden_act``)."""
    by_name: dict[str, type[nn.Module]] = {"relu": ReLU, "silu": SiLU, "swish": SiLU, "gelu": GELU}
    if name not in by_name:
        raise ValueError(f"unsupported activation {name!r}; known: {', '.join(sorted(by_name))}")
    return by_name[name]()
