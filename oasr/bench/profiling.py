"""One run under torch's profiler: device kernel time beside wall time, kernel time by kind, the top ops.

The kinds (``kernel_kind``) answer the first question of a slow run: is it the matmuls, attention, convolution,
or the elementwise passes between them. Names are matched loosely (cuBLAS, cuDNN, CUTLASS, flash and Triton
kernels each name themselves differently); what matches nothing is "other".
"""

from __future__ import annotations

from collections.abc import Callable

# (kind, name fragments), first match wins: attention before gemm (flash kernels mention gemm-like tiles).
KERNEL_KINDS = (
    ("attention", ("flash", "fmha", "attention", "attn", "sdpa")),
    ("conv", ("conv", "implicit", "winograd", "dgrad", "wgrad", "fprop")),
    ("gemm", ("gemm", "cutlass", "nvjet", "xmma", "scaled_mm", "matmul", "_mm_")),
    ("triton", ("triton",)),
    ("copy", ("copy", "cat", "memcpy", "memset", "index", "gather", "scatter")),
)


def kernel_kind(name: str) -> str:
    lowered = name.lower()
    for kind, fragments in KERNEL_KINDS:
        if any(f in lowered for f in fragments):
            return kind
    return "other"


def device_kernels(events) -> list:
    """The kernels among a profile's averaged events: an op's row repeats its kernels' time, and so does a
    compiled graph's range ("## Call ...")."""
    from torch.autograd import DeviceType

    return [e for e in events if e.device_type == DeviceType.CUDA and not e.key.startswith("## ")]


def time_by_kind(kernels) -> dict[str, float]:
    """Seconds of kernel time per ``kernel_kind``, largest first."""
    kinds: dict[str, float] = {}
    for e in kernels:
        kind = kernel_kind(e.key)
        kinds[kind] = kinds.get(kind, 0.0) + e.self_device_time_total / 1e6
    return dict(sorted(kinds.items(), key=lambda kv: -kv[1]))


def profile_oasr(run: Callable[[], tuple], top: int = 25) -> None:
    """Runs ``run`` (-> (wall seconds, ...)) once under torch's profiler; prints the device's kernel time beside
    the wall time (the difference is time the device sat idle waiting for the host), the kernel time by kind,
    the ``top`` kernels by device time, then the ``top`` torch ops by the shapes they ran at."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        seconds = run()[0]
    kernels = device_kernels(prof.key_averages())
    busy = sum(e.self_device_time_total for e in kernels) / 1e6
    print(f"profiled run: {seconds:.3f} s wall, {busy:.3f} s of device kernels")
    print("by kind: " + ", ".join(f"{k} {v:.3f} s" for k, v in time_by_kind(kernels).items()))
    kernels.sort(key=lambda e: e.self_device_time_total, reverse=True)
    for e in kernels[:top]:
        print(f"{e.self_device_time_total / 1e3:10.1f} ms {e.count:7d}x {kernel_kind(e.key):9s} {e.key[:110]}")
    ops = [e for e in prof.key_averages(group_by_input_shape=True) if e.device_type != DeviceType.CUDA]
    ops.sort(key=lambda e: e.device_time_total, reverse=True)
    for e in ops[:top]:
        print(f"{e.device_time_total / 1e3:10.1f} ms {e.count:6d}x {e.key[:32]:32s} {str(e.input_shapes)[:150]}")
