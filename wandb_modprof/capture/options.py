"""Option values accepted at the public boundary, validated once."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from wandb_modprof._errors import ModProfError


class Timing(enum.Enum):
    """How time is measured: `auto` = host clock on CPU, device events on accelerators."""

    AUTO = "auto"
    CPU = "cpu"
    DEVICE = "device"


@dataclass(frozen=True)
class Options:
    timing: Timing = Timing.AUTO
    activations: bool = True  # saved-tensor hooks during sampled forwards
    norms: bool = True  # parameter and gradient norms per module
    # a structure pass (graph, FLOPs) on its own, untimed step; before it, a first sample
    # derives the graph from its own forward (`step_dataflow`)
    structure: bool = True
    nvtx: bool = False  # NVTX ranges per module forward/backward on sampled steps
    # the model's first this many steps run untimed (one-time start-up: `Sample.cold_start`)
    warmup: int = 0
    # the roofline's peaks (FLOP/s, bytes/s); None: found by `structure.calibration`
    peak_flops: float | None = None
    peak_bw: float | None = None


def parse_timing(value: object) -> Timing:
    if isinstance(value, Timing):
        return value
    if isinstance(value, str):
        try:
            return Timing(value)
        except ValueError:
            pass
    allowed = ", ".join(repr(t.value) for t in Timing)
    raise ModProfError(f"timing must be one of {allowed}; got {value!r}")


def check_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ModProfError(f"{name} must be True or False; got {value!r} ({type(value).__name__})")
    return value


def check_warmup(value: object) -> int:
    if type(value) is not int or value < 0:
        raise ModProfError(
            f"warmup must be an integer >= 0 (steps run untimed first); got {value!r} "
            f"({type(value).__name__})"
        )
    return value


def check_peak(name: str, value: object) -> float | None:
    """`peak_flops=` / `peak_bw=`: None, or a finite number > 0 (per second)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ModProfError(f"{name} expected None or a number > 0 per second; got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ModProfError(f"{name} expected None or a finite number > 0 per second; got {value}")
    return float(value)


def parse_options(
    *,
    timing: object,
    activations: object,
    norms: object,
    structure: object,
    nvtx: object,
    warmup: object = 0,
    peak_flops: object = None,
    peak_bw: object = None,
) -> Options:
    """The `Options` of a `watch` / `profile` call, every argument checked."""
    return Options(
        timing=parse_timing(timing),
        activations=check_bool("activations", activations),
        norms=check_bool("norms", norms),
        structure=check_bool("structure", structure),
        nvtx=check_bool("nvtx", nvtx),
        warmup=check_warmup(warmup),
        peak_flops=check_peak("peak_flops", peak_flops),
        peak_bw=check_peak("peak_bw", peak_bw),
    )
