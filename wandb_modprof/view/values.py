"""The metric values of one node row: from a call's statistics and FLOPs (module nodes), from
the view's own work (`self` nodes) or summed over merged modules (group nodes). Takes
`ModuleStats` and `CallInfo`; gives `{column: float}` for the row writer, which drops values
that are not finite (see `wandb_modprof.view.table`).

>>> from wandb_modprof.records.sample import RunningStat
>>> stat = RunningStat(count=3, mean=3.0, std=1.6, min=2.0, max=5.0, last=2.0, median=2.0)
>>> stats = ModuleStats("fc#0", "fc", "Linear", 0, None, 1, 0, {"fwd_ms": stat})
>>> values = module_values(stats, None)
>>> values["fwd_ms"], values["fwd_ms_mean"], values["fwd_ms_max"]
(2.0, 3.0, 5.0)

A metric's column holds its colour statistic (`RunningStat.typical`: the median; the mean for
a version-1 file, which kept no medians), the spread columns the rest.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from wandb_modprof.records.calls import CallInfo, Structure
from wandb_modprof.records.roofline import (
    RAISE_MIN_MS,
    Roofline,
    efficiency,
    latest_roofline,
    raised,
)
from wandb_modprof.records.sample import MEMORY_METRICS, TIME_METRICS, ModuleStats, RunningStat
from wandb_modprof.records.stat_columns import ColumnMetrics
from wandb_modprof.view.columns import BOUND_CODES, FLOP_COLUMNS, SPREAD_METRICS, WORK_COLUMNS

# Summed when cheap modules merge into a group node; spans, peaks and norms are not additive
# (nor rates and shares: derived again from the sums).
ADDITIVE = (
    frozenset(TIME_METRICS) - {"bwd_span_ms"}
    | frozenset(MEMORY_METRICS)
    | frozenset(FLOP_COLUMNS)
    | frozenset(WORK_COLUMNS)
) - {"fwd_flop_per_s"}
# A `self` node shows the view's own work: these metrics of the view, under these columns.
_SELF_FROM = {
    "fwd_ms": "fwd_self_ms",
    "fwd_self_ms": "fwd_self_ms",
    "bwd_ms": "bwd_self_ms",
    "bwd_self_ms": "bwd_self_ms",
    "act_bytes": "act_self_bytes",
    "act_self_bytes": "act_self_bytes",
}
_OWN_STATIC = ("param_bytes", "param_count", "buffer_bytes", "grad_bytes", "optim_bytes")


def as_float(value: float) -> float:
    """`value` as a float; an int beyond a float's range becomes +-inf instead of raising.

    Every number taken from the profile goes through here, so the arithmetic below sees only
    floats: NaN and inf propagate through sums and differences and are dropped (as missing)
    when the row is written, never an `OverflowError` in the middle of `table()`."""
    try:
        return float(value)
    except OverflowError:  # only ints overflow: a loaded file can hold 10**400
        return math.inf if value > 0 else -math.inf


def finite(value: float | None) -> float | None:
    """`value` as a finite float, or None where it is missing, NaN, infinite or too large."""
    if value is None:
        return None
    number = as_float(value)
    return number if math.isfinite(number) else None


def _metric_values(stats: ModuleStats | None) -> dict[str, float]:
    if stats is None:
        return {}
    out: dict[str, float]
    if isinstance(stats.metrics, ColumnMetrics):  # running statistics: read from the arrays
        out = stats.metrics.value_columns(SPREAD_METRICS)
    else:  # a loaded file's statistics
        out = {}
        for metric, stat in stats.metrics.items():
            out[metric] = as_float(stat.typical)
            if metric in SPREAD_METRICS:
                _spread(out, metric, stat)
    gc = stats.metrics.get("gc_ms")
    if gc is not None and stats.gc_samples is not None:
        out["gc_ms_max"] = as_float(gc.max)
        out["gc_samples"] = float(stats.gc_samples)
    return out


def _spread(out: dict[str, float], column: str, stat: RunningStat) -> None:
    out[f"{column}_mean"] = as_float(stat.mean)
    out[f"{column}_std"] = as_float(stat.std)
    out[f"{column}_min"] = as_float(stat.min)
    out[f"{column}_max"] = as_float(stat.max)
    out[f"{column}_last"] = as_float(stat.last)


def self_values(
    view: ModuleStats | None,
    kids: Sequence[ModuleStats],
    call: CallInfo | None,
    roofline: Roofline | None = None,
) -> dict[str, float]:
    """The view's own work: its self time and self activations, the parameters it holds
    itself (not through a child), and the FLOPs of its own ops."""
    out: dict[str, float] = {}
    if view is not None:
        for column, metric in _SELF_FROM.items():
            stat = view.metrics.get(metric)
            if stat is not None:
                out[column] = as_float(stat.typical)
                if column in SPREAD_METRICS:
                    _spread(out, column, stat)
        # Once per child module: a module called three times holds its parameters once.
        distinct = {k.module_name: k for k in kids}.values()
        for metric in _OWN_STATIC:
            total = view.metrics.get(metric)
            if total is not None:
                inner = sum(
                    as_float(v) for v in (k.typical(metric) for k in distinct) if v is not None
                )
                own = as_float(total.typical) - inner
                # tied weights can overcount; max() would also turn a NaN into 0, so not then
                out[metric] = max(0.0, own) if math.isfinite(own) else own
    if call is not None:
        out.update(counted_values(call, own=True))
    derived_values(out, roofline)
    return out


def counted_values(call: CallInfo, own: bool = False) -> dict[str, float]:
    """What the structure pass counted of `call` (its FLOPs, and where known its other work:
    `WORK_COLUMNS`), inclusive, or `own` code only (a `self` node's); its caller checked
    `call.flops_known`."""
    flops = call.fwd_self_flops if own else call.fwd_flops
    out = {"fwd_flops": as_float(flops), "fwd_self_flops": as_float(call.fwd_self_flops)}
    if call.work_known:
        out["bwd_flops"] = as_float(call.bwd_self_flops if own else call.bwd_flops)
        out["fwd_bytes"] = as_float(call.fwd_self_bytes if own else call.fwd_bytes)
        out["fwd_ops"] = as_float(call.fwd_self_ops if own else call.fwd_ops)
    if call.work_known and call.bwd_work_known:
        out["bwd_bytes"] = as_float(call.bwd_self_bytes if own else call.bwd_bytes)
        out["bwd_ops"] = as_float(call.bwd_self_ops if own else call.bwd_ops)
    return out


def derived_values(out: dict[str, float], roofline: Roofline | None) -> None:
    """The columns derived from the others: FLOP/s, and the roofline's (`EFFICIENCY_COLUMNS`)
    of the forward and of the backward, each where its time, its work and the machine's
    roofline are all known (`records.roofline.efficiency`: the share capped at 100 %, the time
    lost at 0; a call without work gets its class only)."""
    fwd_ms = out.get("fwd_ms")
    if "fwd_flops" in out and fwd_ms is not None and math.isfinite(fwd_ms) and fwd_ms > 0:
        out["fwd_flop_per_s"] = out["fwd_flops"] / (fwd_ms / 1000.0)
    if roofline is None:
        return
    for way in ("fwd", "bwd"):
        flops, nbytes, ops, ms = (f"{way}_flops", f"{way}_bytes", f"{way}_ops", f"{way}_ms")
        if any(c not in out for c in (flops, nbytes, ops, ms)):
            continue
        found = efficiency(out[flops], out[nbytes], out[ops], out[ms], roofline)
        if found is None:
            continue
        out[f"{way}_bound"] = float(BOUND_CODES[found.bound])
        if found.pct is not None and found.lost_ms is not None:  # (not for a call without work)
            out[f"{way}_roofline_pct"] = found.pct
            out[f"{way}_lost_ms"] = found.lost_ms


def module_values(
    stats: ModuleStats | None, call: CallInfo | None, roofline: Roofline | None = None
) -> dict[str, float]:
    """A module node's metrics; `call` (its FLOPs) only when the structure pass counted them."""
    out = _metric_values(stats)
    if call is not None:
        out.update(counted_values(call))
    derived_values(out, roofline)
    return out


def group_values(
    members: list[str],
    stats: Mapping[str, ModuleStats],
    calls: Mapping[str, CallInfo],
    roofline: Roofline | None = None,
) -> dict[str, float]:
    """A group node's metrics: the sums over its merged modules of the `ADDITIVE` ones."""
    out: dict[str, float] = {}
    for key in members:
        call = calls[key]
        values = module_values(stats.get(key), call if call.flops_known else None)
        for column, value in values.items():
            if column in ADDITIVE:
                out[column] = out.get(column, 0.0) + value
    derived_values(out, roofline)
    return out


def profile_roofline(
    structures: Sequence[Structure], calls: Iterable[CallInfo], stats: Mapping[str, ModuleStats]
) -> Roofline | None:
    """The roofline a profile's efficiencies are measured against: its newest structure pass's,
    its peak FLOP/s raised to the fastest call of at least `RAISE_MIN_MS` (`roofline.raised`)."""
    line = latest_roofline(structures)
    if line is None:
        return None
    rates = []
    for call in calls:
        known = stats.get(call.key)
        if known is None or not call.flops_known:
            continue
        counted = [("fwd_ms", call.fwd_flops)]
        if call.work_known:
            counted.append(("bwd_ms", call.bwd_flops))
        for metric, flops in counted:
            ms = known.typical(metric)
            if ms is not None and math.isfinite(ms) and ms >= RAISE_MIN_MS:
                rates.append(as_float(flops) / (ms / 1000.0))
    return raised(line, rates)
