"""The analysis modes of the panel: what a node is coloured by, read from the flat table.

One list serves the Vega spec (generated from it by `tools/build_spec.py`), the Python API
(validating a default mode) and the tests (computing the colour a node must get).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Mode:
    key: str  # the value of the spec's `mode` signal and of `default_mode=`
    label: str  # legend entry
    group: str  # legend column heading
    unit: str  # "ms" | "bytes" | "flops" | "flop_s" | "norm" | "ratio": how values are written
    columns: tuple[str, ...]  # table columns the value reads; missing if any of them is
    combine: str  # "sum" or "max" of `columns`
    total: str  # meta row whose meta_number is the model total ("" = no share shown)

    def value(self, row: Mapping[str, object]) -> float | None:
        """The node's value in this mode, or None where the table says it was not measured."""
        missing = str(row.get("missing", ""))
        if missing == "*" or any(c in missing.split(",") or c not in row for c in self.columns):
            return None  # (a table from before a column existed has no such cell)
        values = [float(row[c]) for c in self.columns]  # type: ignore[arg-type]
        return sum(values) if self.combine == "sum" else max(values)


MODES: tuple[Mode, ...] = (
    Mode("fwd", "Forward", "Time", "ms", ("fwd_ms",), "sum", "total_fwd_ms"),
    Mode("bwd", "Backward", "Time", "ms", ("bwd_ms",), "sum", "total_bwd_ms"),
    Mode("fwd_bwd", "Fwd + bwd", "Time", "ms", ("fwd_ms", "bwd_ms"), "sum", "total_fwd_bwd_ms"),
    Mode(
        "self",
        "Self (fwd + bwd)",
        "Time",
        "ms",
        ("fwd_self_ms", "bwd_self_ms"),
        "sum",
        "total_fwd_bwd_ms",
    ),
    Mode("act", "Activations", "Memory", "bytes", ("act_bytes",), "sum", "total_act_bytes"),
    Mode("param", "Parameters", "Memory", "bytes", ("param_bytes",), "sum", "total_param_bytes"),
    Mode("grad", "Gradients", "Memory", "bytes", ("grad_bytes",), "sum", "total_grad_bytes"),
    Mode(
        "optim", "Optimizer state", "Memory", "bytes", ("optim_bytes",), "sum", "total_optim_bytes"
    ),
    Mode(
        "peak",
        "Peak (device)",
        "Memory",
        "bytes",
        ("fwd_mem_peak_bytes", "bwd_mem_peak_bytes"),
        "max",
        "",
    ),
    Mode("param_norm", "Parameter norm", "Health", "norm", ("param_norm",), "sum", ""),
    Mode("grad_norm", "Gradient norm", "Health", "norm", ("grad_norm",), "sum", ""),
    Mode("flops", "FLOPs (fwd)", "Compute", "flops", ("fwd_flops",), "sum", "total_fwd_flops"),
    Mode("flop_s", "FLOP/s (fwd)", "Compute", "flop_s", ("fwd_flop_per_s",), "sum", ""),
    # max / mean over ranks of the call's fwd + bwd time (distributed runs only): stragglers
    Mode("imbalance", "Rank imbalance", "Ranks", "ratio", ("rank_imbalance",), "sum", ""),
)
MODE_KEYS: tuple[str, ...] = tuple(m.key for m in MODES)
DEFAULT_MODE = "fwd_bwd"
SCALES = ("linear", "log")
DEFAULT_SCALE = "linear"


def mode(key: str) -> Mode:
    for m in MODES:
        if m.key == key:
            return m
    raise KeyError(key)
