"""The machine's roofline (`records.roofline.Roofline`), found once per process and device:
attached to each structure pass's graph, so every profile says what its efficiencies are
measured against.

- CPU: a short calibration on the training process's own threads (a fraction of a second, once): the
  best of a few square GEMMs and 3 x 3 convolutions of the model's floating dtype (FLOP/s), of
  a large tensor copy (bytes read + written per second) and of a batch of tiny adds (per-op
  overhead).
- CUDA: the data sheet's dense peak for the dtype and the memory bandwidth where the device is
  in `DATA_SHEETS`; otherwise the same calibration on the device. The per-op overhead is
  always measured (launch + dispatch).
- `watch(..., peak_flops=, peak_bw=)` / `profile(...)` override either peak ("given").
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

import torch
from torch import nn
from torch.nn.parameter import is_lazy

from wandb_modprof.capture.step.random_state import keeping
from wandb_modprof.records.roofline import Roofline

# name fragment -> (dense FLOP/s by dtype, memory bytes/s). Dense tensor-core peaks from the
# vendors' data sheets (no sparsity); float32 is the non-tensor-core rate PyTorch uses by
# default (TF32 matmul is off unless `torch.backends.cuda.matmul.allow_tf32`).
_T = 1e12
DATA_SHEETS: tuple[tuple[str, dict[str, float], float], ...] = (
    ("H200", {"bfloat16": 989 * _T, "float16": 989 * _T, "float32": 67 * _T}, 4.8e12),
    ("H100 PCIe", {"bfloat16": 756 * _T, "float16": 756 * _T, "float32": 51 * _T}, 2.0e12),
    ("H100", {"bfloat16": 989 * _T, "float16": 989 * _T, "float32": 67 * _T}, 3.35e12),
    ("A100-SXM4-80GB", {"bfloat16": 312 * _T, "float16": 312 * _T, "float32": 19.5 * _T}, 2.04e12),
    ("A100", {"bfloat16": 312 * _T, "float16": 312 * _T, "float32": 19.5 * _T}, 1.56e12),
    ("L4", {"bfloat16": 121 * _T, "float16": 121 * _T, "float32": 30.3 * _T}, 0.3e12),
    ("V100", {"float16": 125 * _T, "float32": 15.7 * _T}, 0.9e12),
    ("T4", {"float16": 65 * _T, "float32": 8.1 * _T}, 0.32e12),
)
_REPEATS = 5


def model_device_dtype(model: nn.Module) -> tuple[torch.device, torch.dtype]:
    """Where the model's parameters live and their most common floating dtype."""
    counts: dict[tuple[torch.device, torch.dtype], int] = {}
    for p in model.parameters():
        # (an uninitialised lazy parameter has a dtype but no size yet: left out)
        if p.is_floating_point() and p.device.type != "meta" and not is_lazy(p):
            key = (p.device, p.dtype)
            counts[key] = counts.get(key, 0) + p.numel()
    if not counts:
        return torch.device("cpu"), torch.float32
    return max(counts, key=lambda k: counts[k])


def roofline_of(
    model: nn.Module, peak_flops: float | None = None, peak_bw: float | None = None
) -> Roofline:
    """The roofline `model`'s calls are measured against (given peaks win)."""
    device, dtype = model_device_dtype(model)
    found = measured_roofline(str(device), str(dtype).removeprefix("torch."))
    if peak_flops is None and peak_bw is None:
        return found
    return Roofline(
        found.device,
        found.peak_flops if peak_flops is None else float(peak_flops),
        found.peak_bytes_per_s if peak_bw is None else float(peak_bw),
        found.op_overhead_ms,
        "given" if peak_flops is not None and peak_bw is not None else f"given + {found.source}",
        found.dtype,
    )


def calibrated() -> bool:
    """Whether this process has calibrated a roofline already (a pass's first does)."""
    return measured_roofline.cache_info().currsize > 0


@functools.cache
@keeping("the roofline's calibration")
def measured_roofline(device_name: str, dtype_name: str) -> Roofline:
    """The calibration, once per process, device and dtype (cached)."""
    device = torch.device(device_name)
    dtype = getattr(torch, dtype_name, torch.float32)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        dtype = torch.float32
    with torch.no_grad(), torch.autograd.profiler.record_function("wandb_modprof.calibration"):
        overhead_ms = _op_overhead_ms(device)
        sheet = _data_sheet(device, str(dtype).removeprefix("torch."))
        if sheet is not None:
            label, flops, bandwidth = sheet
            return Roofline(label, flops, bandwidth, overhead_ms, "table", dtype_name)
        flops = _gemm_flops(device, dtype)
        bandwidth = _copy_bandwidth(device)
    label = device_name if device.type == "cpu" else f"{device_name} {_device_label(device)}"
    gemm = str(dtype).removeprefix("torch.")
    return Roofline(label, flops, bandwidth, overhead_ms, "measured", gemm)


def _device_label(device: torch.device) -> str:
    try:
        return str(torch.cuda.get_device_name(device)) if device.type == "cuda" else ""
    except Exception:  # no driver: the calibration fails later with a clear error anyway
        return ""


def _data_sheet(device: torch.device, dtype_name: str) -> tuple[str, float, float] | None:
    if device.type != "cuda":
        return None
    name = _device_label(device)
    for fragment, peaks, bandwidth in DATA_SHEETS:
        if fragment in name and dtype_name in peaks:
            return f"{device} {name}", peaks[dtype_name], bandwidth
    return None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _best_seconds(
    run: Callable[[], object], device: torch.device, repeats: int = _REPEATS
) -> float:
    run()  # warm: allocation, kernel selection
    _sync(device)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return best


def _gemm_flops(device: torch.device, dtype: torch.dtype) -> float:
    """The better of a square GEMM and a 3 x 3 convolution: on CPU oneDNN's convolutions can
    reach more than a plain matmul, and the roofline is what the machine allows, not what one
    kernel reaches."""
    n = 512 if device.type == "cpu" else 4096
    # constants, not torch.randn: the user's random stream must not move
    a = torch.full((n, n), 0.5, device=device, dtype=dtype)
    b = torch.full((n, n), 0.25, device=device, dtype=dtype)
    reps = 4
    seconds = _best_seconds(lambda: [torch.mm(a, b) for _ in range(reps)], device)
    gemm = 2.0 * n**3 * reps / seconds
    batch = 16 if device.type == "cpu" else 128
    x = torch.full((batch, 64, 32, 32), 0.5, device=device, dtype=dtype)
    w = torch.full((64, 64, 3, 3), 0.01, device=device, dtype=dtype)
    seconds = _best_seconds(lambda: torch.nn.functional.conv2d(x, w, padding=1), device)
    conv = 2.0 * batch * 64 * 64 * 9 * 32 * 32 / seconds
    return max(gemm, conv)


def _copy_bandwidth(device: torch.device) -> float:
    # 32 MiB on CPU (beyond its caches), 128 MiB on a device not in DATA_SHEETS
    numel = (32 if device.type == "cpu" else 128) * 2**20 // 4
    src = torch.ones(numel, device=device)
    dst = torch.empty_like(src)
    seconds = _best_seconds(lambda: dst.copy_(src), device)
    return 2.0 * numel * 4 / seconds  # read + written


def _op_overhead_ms(device: torch.device) -> float:
    """One tiny op as a training forward runs it: recorded for autograd (a node per op)."""
    x = torch.ones(1, device=device, requires_grad=True)
    y = torch.ones(1, device=device)
    ops = 200
    with torch.enable_grad():
        seconds = _best_seconds(lambda: [torch.add(x, y) for _ in range(ops)], device)
    return 1e3 * seconds / ops
