"""The value rules of a profile file's times and memory curve (`profile_schema._check` applies
them and names the field): what a file must hold so that every sink can draw it.

- Every time (a `*_ms` field of a call, the step totals, a backward run, a curve point, and the
  statistics of a time metric) is NaN (not measured) or within `TIME_LIMIT_MS` of the step's
  start. A longer time is not a measurement (1e12 ms is 31 years): `1e308` loaded, then
  printed 300 digits in the summary and broke the trace export (microseconds overflow).
- A duration that includes everything below it (`fwd_ms`, `bwd_ms`, the spans, `recompute_ms`,
  garbage-collection time) is >= 0; self times may be below 0 (an inclusive time minus its
  children's, each measured with its own error).
- A backward run, and a call's backward window, end no earlier than they start.
- A memory curve has a known source, one value per time, times in order and no negative bytes.
"""

from __future__ import annotations

import json
import math

from wandb_modprof.records.sample import (
    CURVE_SOURCES,
    TIME_METRICS,
    BackwardRun,
    InvocationRecord,
    MemoryCurve,
    ModuleStats,
    RunningStat,
    StepTotals,
)

TIME_LIMIT_MS = 1e12
Problem = tuple[str, str] | None  # (field, what is wrong), None: nothing

_TIMES: dict[type, tuple[str, ...]] = {
    InvocationRecord: tuple(
        name for name in InvocationRecord.__dataclass_fields__ if name.endswith("_ms")
    ),
    StepTotals: ("fwd_ms", "bwd_ms"),
    BackwardRun: ("start_ms", "end_ms"),
}
DURATIONS = frozenset(("fwd_ms", "bwd_ms", "bwd_span_ms", "recompute_ms", "gc_ms", "fwd_wall_ms"))
# (start, end) pairs: the end is not before the start
_WINDOWS: dict[type, tuple[str, str]] = {
    BackwardRun: ("start_ms", "end_ms"),
    InvocationRecord: ("bwd_start_ms", "bwd_end_ms"),
}
_STAT_FIELDS = ("mean", "std", "min", "max", "last", "median")


def _time(value: float | None, duration: bool) -> str | None:
    if value is None or math.isnan(value):
        return None  # not measured
    if not -TIME_LIMIT_MS <= value <= TIME_LIMIT_MS:
        return f"expected a time within ±{TIME_LIMIT_MS:g} ms (or NaN: not measured), got {value!r}"
    if duration and value < 0:
        return f"expected >= 0 (a duration), got {value!r}"
    return None


def time_problem(obj: object) -> Problem:
    """What is wrong with the times of one record (see the module docstring), if anything."""
    if isinstance(obj, ModuleStats):
        for metric, stat in obj.metrics.items():
            problem = statistic_time_problem(metric, stat)
            if problem is not None:
                return f"metrics[{json.dumps(metric)}].{problem[0]}", problem[1]
        return None
    if isinstance(obj, MemoryCurve):
        return _curve_problem(obj)
    for name in _TIMES.get(type(obj), ()):
        wrong = _time(getattr(obj, name), duration=name in DURATIONS)
        if wrong is not None:
            return name, wrong
    window = _WINDOWS.get(type(obj))
    if window is not None:
        start, end = getattr(obj, window[0]), getattr(obj, window[1])
        if start is not None and end is not None and end < start:  # (NaN: not compared)
            return window[1], f"expected >= {window[0]} ({start!r}), got {end!r}"
    return None


def statistic_time_problem(metric: str, stat: RunningStat) -> Problem:
    """What is wrong with the times of one statistic of `metric` (none unless a time metric)."""
    if metric in TIME_METRICS:
        for name in _STAT_FIELDS:
            wrong = _time(getattr(stat, name), duration=name == "std")
            if wrong is not None:
                return name, wrong
    return None


def _curve_problem(curve: MemoryCurve) -> Problem:
    if curve.source not in CURVE_SOURCES:
        expected = " or ".join(json.dumps(k) for k in CURVE_SOURCES)
        shown = json.dumps(curve.source)
        return (
            "source",
            f"expected {expected}, got {shown if len(shown) <= 40 else shown[:37] + '...'}",
        )
    if len(curve.t_ms) != len(curve.live_bytes):
        got = f"{len(curve.live_bytes)} values for {len(curve.t_ms)} times"
        return "live_bytes", f"expected one value per time, got {got}"
    for i, t in enumerate(curve.t_ms):
        wrong = _time(t, duration=False)
        if wrong is not None:
            return f"t_ms[{i}]", wrong
        if i and not curve.t_ms[i - 1] <= t:
            return (
                f"t_ms[{i}]",
                f"expected non-decreasing times, got {t!r} after {curve.t_ms[i - 1]!r}",
            )
    for i, value in enumerate(curve.live_bytes):
        if value < 0:
            return f"live_bytes[{i}]", f"expected >= 0 (a size), got {value}"
    return None
