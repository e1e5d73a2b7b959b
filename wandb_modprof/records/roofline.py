"""The roofline a module call is measured against, and where a call stands under it.

A call's forward does `flops` FLOPs and moves `nbytes` bytes in `ops` ATen ops (counted by
the structure pass: `CallInfo.fwd_flops`, `fwd_bytes`, `fwd_ops`), and takes `ms` (measured);
its backward likewise (`bwd_flops`, `bwd_bytes`, `bwd_ops`, counted on the pass's backward).
At the machine's peaks it could not take less than

    t_roof = max(flops / peak_flops, nbytes / peak_bytes_per_s)

which is the roofline: achieved FLOP/s over `min(peak_flops, intensity x peak_bytes_per_s)`,
with intensity = flops / nbytes, equals t_roof / ms. `efficiency` gives that share (in %),
the time lost to it (ms - t_roof) and the class of the call: "compute"-bound where the FLOPs
take longer at peak than the bytes, "memory"-bound where the bytes do, and "overhead"-bound
where the fixed cost of its ops (`ops x op_overhead_ms`: launch, dispatch, Python) is larger
than both: such a call cannot get near its roofline by faster kernels, only by fewer ops.

Two more classes say where the share means nothing:

- "none": no work, a call without FLOPs and without bytes moved (an `nn.Identity`, a dropout
  in eval mode, a wrapper whose own code only calls its children): its roofline is 0, so
  every call would be at 0 % with all its time lost; it has neither share nor time lost;
- "above_compute" / "above_memory": faster than its roofline (the FLOPs' or the bytes' side,
  whichever is longer at peak). A roofline is an upper bound, so the measurement is off:
  the bytes are logical, and data that was cache-resident moved at cache speed, not at the
  memory's peak; or a peak is below the machine's real one (a kernel faster than the
  calibration's, a call too short for `raised`, timer noise). Its share is capped at 100 %
  and its time lost at 0: never above 100 %, never a negative time lost.

>>> line = Roofline("cpu", peak_flops=1e11, peak_bytes_per_s=1e10, op_overhead_ms=0.005,
...                 source="measured")
>>> e = efficiency(flops=2e9, nbytes=1.2e7, ops=1, ms=25.0, roofline=line)
>>> e.bound, round(e.pct), round(e.lost_ms, 1)    # 20 ms at peak FLOP/s of 25 ms
('compute', 80, 5.0)
>>> efficiency(flops=0, nbytes=4e8, ops=1, ms=50.0, roofline=line).bound
'memory'
>>> efficiency(flops=0, nbytes=4e3, ops=40, ms=0.3, roofline=line).bound
'overhead'
>>> efficiency(flops=0, nbytes=0, ops=0, ms=0.01, roofline=line)
Efficiency(pct=None, bound='none', lost_ms=None)
>>> efficiency(flops=0, nbytes=4e8, ops=1, ms=20.0, roofline=line)   # 40 ms at peak GB/s
Efficiency(pct=100.0, bound='above_memory', lost_ms=0.0)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

# The classes, in the order of their codes in the table (`view.columns.BOUND_CODES`: 1, 2, ...):
# new ones go at the end, so a table's codes keep their meaning.
BOUNDS = ("compute", "memory", "overhead", "none", "above_compute", "above_memory")
BOUND_TEXT = {
    "compute": "compute-bound",
    "memory": "memory-bound",
    "overhead": "overhead-bound",
    "none": "no work",
    "above_compute": "above the roofline (compute)",
    "above_memory": "above the roofline (memory)",
}
"""Each class as people read it (the summary's notes; the panel's card writes its own)."""
# A call is above its roofline where t_roof exceeds its time by more than this share: the
# fastest call sets a raised peak (`raised`), and reaches it up to a rounding error.
ABOVE_TOLERANCE = 1e-9


@dataclass(frozen=True)
class Roofline:
    """The machine's peaks: `peak_flops` FLOP/s, `peak_bytes_per_s` bytes/s of memory
    traffic, `op_overhead_ms` per ATen op; `device` where they hold ("cpu", "cuda:0 NVIDIA
    H100 80GB HBM3"), `dtype` the GEMM's ("float32"), `source` how they were found
    ("measured": a short calibration in the process; "table": the device's data sheet;
    "given": `watch(peak_flops=, peak_bw=)`)."""

    device: str
    peak_flops: float
    peak_bytes_per_s: float
    op_overhead_ms: float
    source: str
    dtype: str = "float32"

    def problem(self) -> tuple[str, str] | None:
        """(field, what is wrong) where a peak is not finite and > 0 or the per-op cost not
        finite and >= 0 (a loaded file's: `sinks.file.profile_schema`); None when it makes sense."""
        for name in ("peak_flops", "peak_bytes_per_s", "op_overhead_ms"):
            value = getattr(self, name)
            zero_ok = name == "op_overhead_ms"
            if not (math.isfinite(value) and (value > 0 or (zero_ok and value == 0))):
                bound = ">= 0" if zero_ok else "> 0"
                return name, f"expected a finite number {bound}, got {value!r}"
        return None

    def text(self) -> str:
        """One line for people: "cpu, float32, measured: 189 GFLOP/s, 38.6 GB/s, 2.18 µs per
        op" (the table's `roofline` meta row, `summary --mode eff`)."""
        return (
            f"{self.device}, {self.dtype}, {self.source}: {self.peak_flops / 1e9:.3g} GFLOP/s, "
            f"{self.peak_bytes_per_s / 1e9:.3g} GB/s, {self.op_overhead_ms * 1e3:.3g} µs per op"
        )


@dataclass(frozen=True)
class Efficiency:
    """Where one call's forward stands under the roofline (see the module docstring)."""

    pct: float | None  # 100 x t_roof / ms, at most 100: the share of the roofline reached
    bound: str  # one of BOUNDS
    lost_ms: float | None  # ms - t_roof, at least 0: what the call loses against its roofline

    @property
    def above(self) -> bool:
        """Faster than its roofline (share capped at 100 %, time lost at 0)."""
        return self.bound.startswith("above_")


def latest_roofline(structures: Iterable[Any]) -> Roofline | None:
    """The roofline of the newest structure pass that found one (`Structure.roofline`)."""
    found = None
    for structure in structures:
        found = structure.roofline or found
    return found


RAISE_MIN_MS = 0.05  # calls shorter than this do not raise the peak (timer and hook noise)


def raised(line: Roofline, rates: Iterable[float]) -> Roofline:
    """`line` with its peak FLOP/s raised to the fastest of `rates` (achieved forward and
    backward FLOP/s of the profile's calls) where one is faster: a roofline is an upper bound,
    and a call above it proves the calibration low (a convolution kernel faster than its GEMM,
    TF32 matmuls against a float32 data sheet). Bytes/s are not raised: logical bytes of
    cache-resident ops would lift it to cache speed."""
    fastest = max(rates, default=0.0)
    if not (math.isfinite(fastest) and fastest > line.peak_flops):
        return line
    return dataclasses.replace(
        line, peak_flops=fastest, source=f"{line.source}, raised to the fastest call"
    )


def efficiency(
    flops: float, nbytes: float, ops: float, ms: float | None, roofline: Roofline
) -> Efficiency | None:
    """Where the call stands under `roofline` (the module docstring): `pct` and `lost_ms` are
    None for a call without work (class "none"); `None` where the time is not measured or not
    > 0, or a count is not finite."""
    if ms is None or not (math.isfinite(ms) and ms > 0):
        return None
    if not all(math.isfinite(v) and v >= 0 for v in (flops, nbytes, ops)):
        return None
    if flops == 0 and nbytes == 0:
        return Efficiency(pct=None, bound="none", lost_ms=None)
    compute_ms = 1e3 * flops / roofline.peak_flops
    memory_ms = 1e3 * nbytes / roofline.peak_bytes_per_s
    overhead_ms = ops * roofline.op_overhead_ms
    roof_ms = max(compute_ms, memory_ms)
    side = "compute" if compute_ms >= memory_ms else "memory"
    if roof_ms > ms * (1.0 + ABOVE_TOLERANCE):
        bound = f"above_{side}"
    elif overhead_ms > roof_ms:
        bound = "overhead"
    else:
        bound = side
    pct = min(100.0, 100.0 * roof_ms / ms)
    return Efficiency(pct=pct, bound=bound, lost_ms=max(0.0, ms - roof_ms))
