"""The schema of a profile file: records (frozen dataclasses) to JSON builtins and back,
strictly checked. Takes a `FileData` (or parsed JSON); gives JSON builtins (or a `FileData`,
or a `FileError` saying where the file is wrong). `profile_file.py` describes the format and
does the file I/O.

The schema is read from the dataclasses' type hints, so it follows them; see
`profile_file.py` for the rules (non-finite floats as strings, exact fields, 64-bit integers,
call trees that hold together: `profile_call_tree.py`, times: `profile_times.py`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, get_args, get_origin

from wandb_modprof.records.calls import CallInfo, Structure
from wandb_modprof.records.phases import PhaseStats
from wandb_modprof.records.roofline import Roofline
from wandb_modprof.records.sample import (
    MEMORY_METRICS,
    METRICS,
    BackwardRun,
    InvocationRecord,
    ModuleStats,
    RunningStat,
    Sample,
    StepTotals,
)
from wandb_modprof.sinks.file.profile_call_tree import (
    Problem,
    calls_problem,
    regions_problem,
    tree_problem,
)
from wandb_modprof.sinks.file.profile_encode import hints, is_record, optional
from wandb_modprof.sinks.file.profile_times import statistic_time_problem, time_problem

_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
# Every integer the profiler records (bytes, FLOPs, counts, indices) fits a signed 64-bit int;
# a larger one can only be corrupt, and would overflow a float (or a W&B cell) downstream.
INT_LIMIT = 2**63


# The least value of integer fields that count or measure something (a count, bytes, FLOPs, an
# index); -1 where the profiler writes it for "none" (autograd sequence numbers). A field not
# listed may hold any 64-bit integer (thread ids, clocks, the memory delta, which can be < 0).
_COUNTS = dict.fromkeys(("call_index", "order", "depth"), 0)
AT_LEAST: dict[type, dict[str, int]] = {
    RunningStat: {"count": 0},
    ModuleStats: {**_COUNTS, "gc_samples": 0},
    InvocationRecord: {
        **_COUNTS,
        **dict.fromkeys(("backward_nodes", "param_bytes", "param_count", "buffer_bytes"), 0),
        **dict.fromkeys(("act_bytes", "act_self_bytes", "grad_bytes", "optim_bytes"), 0),
        **dict.fromkeys(("fwd_mem_peak_bytes", "bwd_mem_peak_bytes"), 0),
        **dict.fromkeys(("seq_start", "seq_end"), -1),
        "rows": 0,
    },
    StepTotals: {"act_bytes": 0},
    Sample: {"step": 0},
    BackwardRun: {"seq": -1},
    CallInfo: {
        **_COUNTS,
        **dict.fromkeys(("fwd_flops", "fwd_self_flops", "bwd_flops", "bwd_self_flops"), 0),
        **dict.fromkeys(("fwd_bytes", "fwd_self_bytes", "fwd_ops", "fwd_self_ops"), 0),
        **dict.fromkeys(("bwd_bytes", "bwd_self_bytes", "bwd_ops", "bwd_self_ops"), 0),
        "rows": 0,
    },
}
# Metrics whose every value is >= 0, so their statistics' min is too.
NON_NEGATIVE_METRICS = (
    *MEMORY_METRICS, "fwd_mem_peak_bytes", "bwd_mem_peak_bytes", "gc_ms", "rows",
)  # fmt: skip
# Fields added within version 8, each with its "not recorded" value: a file written before
# them lacks them and reads as that value, one that has them is read as strictly as any field.
# No new version for them: loading tells old from new by the field alone (as statistics of a
# metric are, which a file holds only for the metrics some key measured).
LATER_FIELDS: dict[type, dict[str, Any]] = {
    InvocationRecord: {"rows": None},
    CallInfo: {"rows": None, "rows_linear": False},
    StepTotals: {"phases": None},
}
RUN_KINDS = ("node", "recompute")


@dataclass(frozen=True)
class FileData:
    """What a file holds besides its header (its field names are the file's keys; per-rank
    data is not saved)."""

    model_name: str
    num_samples: int
    stats: dict[str, ModuleStats]
    last_sample: Sample | None
    structures: tuple[Structure, ...]
    cold_left_out: int
    phases: PhaseStats | None = None


AT_LEAST[FileData] = {"num_samples": 0, "cold_left_out": 0}
LATER_FIELDS[FileData] = {"phases": None}


class FileError(Exception):
    """A problem at a JSON path inside the file; `load` turns it into a `ModProfError`."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where}: {problem}" if where else problem)


def decode(value: Any, tp: Any, where: str) -> Any:
    """`value` (parsed JSON) checked against type `tp` and built into it; `where` is its path."""
    tp, nullable = optional(tp)
    if value is None and nullable:
        return None
    if is_record(tp):
        return _record(value, tp, where)
    if get_origin(tp) is tuple:
        if not isinstance(value, list):
            raise FileError(where, f"expected an array, got {describe(value)}")
        item = get_args(tp)[0]
        return tuple(decode(v, item, f"{where}[{i}]") for i, v in enumerate(value))
    if get_origin(tp) in (dict, Mapping):  # a Mapping field is read into a dict
        if not isinstance(value, dict):
            raise FileError(where, f"expected an object, got {describe(value)}")
        item = get_args(tp)[1]
        return {k: decode(v, item, f"{where}[{json.dumps(k)}]") for k, v in value.items()}
    return scalar(value, tp, where, " or null" if nullable else "")


def _record(value: Any, cls: type, where: str) -> Any:
    return decode_record(value, cls, where, decode)


def decode_record(value: Any, cls: type, where: str, field: Callable[[Any, Any, str], Any]) -> Any:
    """A dataclass from a JSON object with exactly its fields, each read by `field(value,
    type, where)` (`decode` here; version 8's reader, `profile_tables`, for its columns)."""
    if not isinstance(value, dict):
        raise FileError(where, f"expected an object ({cls.__name__}), got {describe(value)}")
    names = [f.name for f in fields(cls)]
    absent = absent_later_fields(cls, value)
    if absent:
        value = {**value, **absent}
    exact_fields(value, names, where)
    field_types = hints(cls)
    prefix = f"{where}." if where else ""
    obj = cls(**{n: field(value[n], field_types[n], prefix + n) for n in names})
    check_record(obj, where)
    return obj


def absent_later_fields(cls: type, value: dict[str, Any]) -> dict[str, Any]:
    """The `LATER_FIELDS` of `cls` that the JSON object (or table) `value` lacks, each with its
    JSON value for "not recorded"."""
    later = LATER_FIELDS.get(cls)
    if later is None:
        return {}
    return {name: none for name, none in later.items() if name not in value}


def exact_fields(value: dict[str, Any], names: Sequence[str], where: str) -> None:
    """`value` (a JSON object) has every one of `names` and nothing else."""
    for name in names:
        if name not in value:
            raise FileError(where, f"missing field {json.dumps(name)}")
    if len(value) != len(names):
        for name in value:
            if name not in names:
                raise FileError(where, f"unknown field {json.dumps(name)}")


def scalar(value: Any, tp: type, where: str, or_null: str) -> Any:
    """One JSON value of a `float`, `int`, `str` or `bool` field, checked (`or_null`: what the
    message adds where null is allowed)."""
    if tp is float:
        if isinstance(value, float) and math.isfinite(value):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            try:
                return float(value)
            except OverflowError:
                raise FileError(where, "integer too large for a float") from None
        if isinstance(value, str) and value in _NON_FINITE:
            return _NON_FINITE[value]
        if isinstance(value, float):  # a bare NaN / Infinity literal, or 1e999
            problem = "a non-finite number literal, which is not JSON"
            raise FileError(where, f'{problem}; write "nan", "inf" or "-inf"')
        expected = 'a number or "nan", "inf", "-inf"'
    else:
        assert tp in (int, str, bool), f"no JSON decoding for {tp}"
        # type() not isinstance(): JSON true/false must not pass for an integer
        if type(value) is tp:
            if isinstance(value, int) and abs(value) >= INT_LIMIT:
                raise FileError(
                    where, f"integer out of range: expected |x| < 2**63, got {describe(value)}"
                )
            return value
        expected = {int: "an integer", str: "a string", bool: "true or false"}[tp]
    raise FileError(where, f"expected {expected}{or_null}, got {describe(value)}")


def describe(value: Any) -> str:
    """A parsed JSON value described for an error message, kept short."""
    if isinstance(value, (dict, list)):
        return "an object" if isinstance(value, dict) else "an array"
    text = json.dumps(value)  # a bare NaN literal shows as NaN
    return text if len(text) <= 40 else text[:37] + "..."


def check_record(obj: object, where: str) -> None:
    """Checks the type hints cannot express: ranges, then cross-field rules."""
    _check_values(obj, where)
    if isinstance(obj, FileData):
        for key, stat in obj.stats.items():
            if stat.key != key:
                at = f"stats[{json.dumps(key)}].key"
                raise FileError(at, f"{json.dumps(stat.key)} does not match its key in stats")
        stats = list(obj.stats.values())
        _raise(
            tree_problem(stats, lambda i: f"stats[{json.dumps(stats[i].key)}]", "a key of stats")
        )
        signatures = [s.signature for s in obj.structures]
        for i, signature in enumerate(signatures):
            if signature in signatures[:i]:
                raise FileError(f"structures[{i}].signature", "repeats an earlier structure's")
    elif isinstance(obj, Structure):
        calls = {c.key for c in obj.calls}
        _raise(calls_problem(obj.calls, f"{where}.calls", "a call of this structure", True))
        _raise(regions_problem(obj.calls, where))
        # a view is a call; the other nodes a call or "<call key>|in:<slot>" (|out:, |self).
        # Each distinct node checked once (version 8 writes a node many edges share once), and
        # only its prefixes up to a key's length: each "|" of a long hostile string costs a
        # slice and a lookup.
        longest = max(map(len, calls), default=0)
        nodes: dict[str, bool] = {}
        for i, edge in enumerate(obj.edges):
            for name in ("view_key", "src_key", "dst_key"):
                node = getattr(edge, name)
                ok = node in calls
                if not ok and name != "view_key":
                    known = nodes.get(node)
                    if known is None:
                        ends = (j for j, ch in enumerate(node[: longest + 1]) if ch == "|")
                        known = nodes[node] = any(node[:j] in calls for j in ends)
                    ok = known
                if not ok:
                    at = f"{where}.edges[{i}].{name}"
                    raise FileError(at, f"{json.dumps(node)} is not a call of this structure")


def _check_values(obj: object, where: str) -> None:
    """Value rules of one record: the least value of counts, statistics that make sense,
    known metrics and run kinds, runs charged to a call of their sample."""
    prefix = f"{where}." if where else ""
    check_least(obj, where)
    problem = time_problem(obj)  # times, durations, windows, the memory curve
    if problem is not None:
        raise FileError(prefix + problem[0], problem[1])
    if isinstance(obj, RunningStat):
        _check_stat(obj, prefix)
    elif isinstance(obj, ModuleStats):
        for metric, running in obj.metrics.items():
            _check_metric(metric, running, f"{where}.metrics[{json.dumps(metric)}]")
    elif isinstance(obj, Roofline) and (bad := obj.problem()) is not None:
        raise FileError(prefix + bad[0], bad[1])
    elif isinstance(obj, BackwardRun):
        if obj.kind not in RUN_KINDS:
            expected = " or ".join(json.dumps(k) for k in RUN_KINDS)
            raise FileError(prefix + "kind", f"expected {expected}, got {describe(obj.kind)}")
    elif isinstance(obj, Sample):
        keys = {inv.key for inv in obj.invocations}
        at = f"{prefix}invocations"
        _raise(calls_problem(obj.invocations, at, "a call of this sample", False))
        for i, run in enumerate(obj.runs):
            if run.owner_key not in keys:
                at = f"{prefix}runs[{i}].owner_key"
                raise FileError(at, f"{json.dumps(run.owner_key)} is not a key of invocations")


def check_least(obj: object, where: str) -> None:
    """The least value of each integer field of `obj` that has one (`AT_LEAST`)."""
    prefix = f"{where}." if where else ""
    for name, least in AT_LEAST.get(type(obj), {}).items():
        value = getattr(obj, name)
        if value is not None and value < least:
            rule = "a count or size" if least == 0 else "-1 for none"
            raise FileError(prefix + name, f"expected >= {least} ({rule}), got {value}")


def _check_metric(metric: str, running: RunningStat, at: str) -> None:
    if metric not in METRICS:
        raise FileError(at, f"unknown metric (known: {', '.join(METRICS)})")
    if metric in NON_NEGATIVE_METRICS and running.min < 0:
        got = f"got {running.min!r}"
        raise FileError(f"{at}.min", f"expected >= 0 ({metric} >= 0), {got}")


def check_statistic(metric: str, stat: RunningStat, at: str) -> None:
    """Every rule of one statistic of a known metric at JSON path `at` (what
    `check_record` checks of it, in a `ModuleStats` or alone)."""
    check_record(stat, at)
    problem = statistic_time_problem(metric, stat)
    if problem is not None:
        raise FileError(f"{at}.{problem[0]}", problem[1])
    _check_metric(metric, stat, at)


def _check_stat(stat: RunningStat, prefix: str) -> None:
    # NaN compares false: a NaN std, min or max (an overflowed sum) passes, as it loads today.
    if stat.std < 0:
        raise FileError(prefix + "std", f"expected >= 0 (a standard deviation), got {stat.std!r}")
    if stat.min > stat.max:
        raise FileError(prefix + "min", f"expected <= max ({stat.max!r}), got {stat.min!r}")
    median = stat.median
    finite = median is not None and all(map(math.isfinite, (median, stat.min, stat.max)))
    if finite and not stat.min <= median <= stat.max:  # type: ignore[operator]
        raise FileError(prefix + "median", f"expected within [min, max], got {median!r}")


def _raise(problem: Problem) -> None:
    if problem is not None:
        raise FileError(*problem)
