"""The running statistics in a version-8 profile file: per metric, columns over the call keys
of `stats` (`profile_tables` writes the rest of the file; `profile_file.py` the format).

    "metrics": {"fwd_ms": {"count": [4, 4, null, ...],  one per key of stats; null: none
                           "mean": <floats>,            one per key with a count
                           "varied": [0, 1, 5, ...],    the keys whose samples differed
                           "std": <floats>, "min": <floats>, "max": <floats>,
                           "last": <floats>, "median": <floats>},   one per varied key
                "act_bytes": {...}, ...}

A statistic of a key that `varied` does not list is one value: std 0.0, and min, max, last
and median all equal to its mean (bit for bit): a size or a parameter count the same in every
sample, most of a profile's statistics. `varied` is `true` where it would list every key with
a count (times, as a rule). The columns are `profile_columns` columns (`{"repeat": 4, "times":
n}` for a count every key shares). The metrics are in `METRICS` order, each with a count for
some key, so each key's statistics read back in that order.

Loading checks every statistic of a metric at once with numpy; one a check flags is checked
again alone by the record rules (`profile_schema.check_statistic`), which name it:
`stats["fc#0"].metrics["fwd_ms"].std: expected >= 0 ...`, as for version 7. Statistics that all
have a count above 0 and a median (all the profiler writes) are read into the arrays of
`records.stat_columns`, as the live profile holds them, so loading builds no `RunningStat`;
others (a count of 0, a version-1 profile's null medians) are read into dicts.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from wandb_modprof._errors import ModProfError
from wandb_modprof.records.frozen import frozen
from wandb_modprof.records.sample import METRICS, TIME_METRICS, ModuleStats, RunningStat
from wandb_modprof.records.stat_columns import (
    METRIC_INDEX,
    ColumnMetrics,
    StatColumns,
    shared_rows,
)
from wandb_modprof.sinks.file.profile_columns import (
    Flags,
    Floats,
    bits,
    column,
    float_column,
    floats,
    ints,
)
from wandb_modprof.sinks.file.profile_schema import (
    NON_NEGATIVE_METRICS,
    FileError,
    check_statistic,
    describe,
    exact_fields,
)
from wandb_modprof.sinks.file.profile_times import TIME_LIMIT_MS

Ints = npt.NDArray[np.int64]
SPREAD = ("std", "min", "max", "last", "median")  # written for the varied keys only
FIELDS = ("count", "mean", "varied", *SPREAD)
_M = len(METRICS)


@dataclass(frozen=True)
class _Grid:
    """The statistics of n keys x `METRICS`: `present` where a key has one; `no_median`
    where its median is None (the value then 0)."""

    count: Ints
    mean: Floats
    std: Floats
    min: Floats
    max: Floats
    last: Floats
    median: Floats
    present: Flags
    no_median: Flags


# ---- writing -------------------------------------------------------------------------------
def encode_statistics(stats: Sequence[ModuleStats]) -> dict[str, Any]:
    """The `metrics` of the `stats` table: the statistics of `stats`, per metric."""
    grid = _grid(stats)
    # (each statistic one value: std 0.0, the rest the mean, bit for bit; for all at once)
    mean = bits(grid.mean)
    flat = (bits(grid.std) == 0) & ~grid.no_median
    for name in ("min", "max", "last", "median"):
        flat &= bits(getattr(grid, name)) == mean
    out: dict[str, Any] = {}
    for j, metric in enumerate(METRICS):
        present = grid.present[:, j]
        rows = np.flatnonzero(present)
        if not len(rows):
            continue
        count = grid.count[:, j]
        if len(rows) == len(count) >= 2 and (count == count[0]).all():  # (most: one count)
            counts: Any = {"repeat": int(count[0]), "times": len(count)}
        else:
            counts = count.tolist()
            for i in np.flatnonzero(~present).tolist():
                counts[i] = None
            counts = column(counts)
        varied = rows[~flat[rows, j]]
        block: dict[str, Any] = {
            "count": counts,
            "mean": float_column(grid.mean[rows, j]),
            "varied": True if len(varied) == len(rows) else varied.tolist(),
        }
        for name in SPREAD:
            nulls = grid.no_median[varied, j] if name == "median" else None
            block[name] = float_column(getattr(grid, name)[varied, j], nulls)
        out[metric] = block
    return out


def _grid(stats: Sequence[ModuleStats]) -> _Grid:
    shared = shared_rows([s.metrics for s in stats])
    if shared is not None:
        # the live profile (or a loaded one): rows of one set of arrays, taken at once
        columns, rows = shared[0], np.array(shared[1], np.intp)
        count = columns.count[rows]
        return _Grid(
            count, columns.mean[rows], columns.std[rows], columns.min[rows],
            columns.max[rows], columns.last[rows], columns.median[rows],
            present=count > 0, no_median=np.zeros(count.shape, bool),
        )  # fmt: skip
    n = len(stats)
    count = np.zeros((n, _M), np.int64)
    values = np.zeros((6, n, _M))  # mean, std, min, max, last, median
    present = np.zeros((n, _M), bool)
    no_median = np.zeros((n, _M), bool)
    for i, module in enumerate(stats):
        for metric, stat in module.metrics.items():
            j = METRIC_INDEX.get(metric)
            if j is None:  # (only a profile built by hand: the profiler measures METRICS)
                raise ModProfError(
                    f"cannot save stats[{json.dumps(module.key)}]: unknown metric "
                    f"{metric!r} (known: {', '.join(METRICS)})"
                )
            present[i, j] = True
            count[i, j] = stat.count
            values[:5, i, j] = (stat.mean, stat.std, stat.min, stat.max, stat.last)
            if stat.median is None:
                no_median[i, j] = True
            else:
                values[5, i, j] = stat.median
    mean, std, low, high, last, median = values
    return _Grid(count, mean, std, low, high, last, median, present, no_median)


# ---- reading -------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Metric:
    """One metric's statistics as read: the rows (keys) that have one, and per row its
    fields (`no_median`: None where the median is null)."""

    col: int
    rows: npt.NDArray[np.intp]
    count: Ints
    mean: Floats
    std: Floats
    min: Floats
    max: Floats
    last: Floats
    median: Floats
    no_median: Flags


def decode_statistics(
    value: Any, n: int, at: Callable[[int], str], where: str
) -> list[Mapping[str, RunningStat]]:
    """Per key of `stats` (`n` keys; `at(i)`: the path of the i-th, `stats["<key>"]`), its
    statistics, from the `metrics` object at `where`."""
    if not isinstance(value, dict):
        raise FileError(where, f"expected an object (statistics per metric), got {describe(value)}")
    read: list[_Metric] = []
    for metric, block in value.items():
        col = METRIC_INDEX.get(metric)
        here = f"{where}[{json.dumps(metric)}]"
        if col is None:
            raise FileError(here, f"unknown metric (known: {', '.join(METRICS)})")
        if read and col < read[-1].col:  # (a repeated one is a repeated JSON key: refused)
            raise FileError(here, f"out of order: the metrics go in the order {', '.join(METRICS)}")
        read.append(_read_metric(metric, col, block, n, at, here))
    if all(m.count.min() > 0 and not m.no_median.any() for m in read):
        return _as_columns(read, n)
    out: list[dict[str, RunningStat]] = [{} for _ in range(n)]
    for m in read:
        metric = METRICS[m.col]
        medians: list[Any] = m.median.tolist()
        for k in np.flatnonzero(m.no_median).tolist():
            medians[k] = None
        cells = zip(
            m.rows.tolist(), m.count.tolist(), m.mean.tolist(), m.std.tolist(),
            m.min.tolist(), m.max.tolist(), m.last.tolist(), medians, strict=True,
        )  # fmt: skip
        for row, *fields in cells:
            out[row][metric] = frozen(RunningStat, dict(zip(_STAT_NAMES, fields, strict=True)))
    return list(out)


_STAT_NAMES = ("count", "mean", "std", "min", "max", "last", "median")


def _as_columns(read: list[_Metric], n: int) -> list[Mapping[str, RunningStat]]:
    """The statistics as the live profile holds them: a row of arrays per key."""
    grid = {name: np.zeros((n, _M)) for name in _STAT_NAMES[1:]}
    count = np.zeros((n, _M), np.int64)
    for m in read:
        count[m.rows, m.col] = m.count
        for name, values in grid.items():
            values[m.rows, m.col] = getattr(m, name)
    columns = StatColumns(count=count, **grid)
    return [ColumnMetrics(columns, row) for row in range(n)]


def _read_metric(
    metric: str, col: int, block: Any, n: int, at: Callable[[int], str], where: str
) -> _Metric:
    if not isinstance(block, dict):
        raise FileError(
            where, f"expected an object (the statistics of {metric}), got {describe(block)}"
        )
    exact_fields(block, FIELDS, where)

    def entry(row: int) -> str:
        return f"{at(row)}.metrics[{json.dumps(metric)}]"

    counts = ints(block["count"], n, True, lambda i: f"{entry(i)}.count", f"{where}.count")
    rows = np.array([i for i, c in enumerate(counts) if c is not None], np.intp)
    if not len(rows):
        raise FileError(f"{where}.count", "no key has a statistic (leave the metric out)")
    row_list = rows.tolist()
    mean, _ = floats(block["mean"], len(rows), False, _at(entry, row_list, "mean"), f"{where}.mean")
    varied = _varied(block["varied"], rows, n, metric, f"{where}.varied")
    spread = {
        name: floats(block[name], len(varied), name == "median", _at(entry, varied, name), here)
        for name in SPREAD
        for here in [f"{where}.{name}"]
    }
    at_varied = np.searchsorted(rows, varied)  # (the positions of the varied keys in `rows`)
    full: dict[str, Floats] = {}
    for name in SPREAD:  # a key not varied: std 0.0, the rest its mean
        full[name] = np.zeros(len(rows)) if name == "std" else mean.copy()
        full[name][at_varied] = spread[name][0]
    no_median = np.zeros(len(rows), bool)
    median_nulls = spread["median"][1]
    if median_nulls is not None:
        no_median[at_varied] = median_nulls
    flat = (bits(full["std"][at_varied]) == 0) & ~no_median[at_varied]
    for name in ("min", "max", "last", "median"):
        flat &= bits(full[name][at_varied]) == bits(mean[at_varied])
    if flat.any():
        k = int(np.flatnonzero(flat)[0])
        raise FileError(
            f"{where}.varied[{k}]",
            f"{varied[k]} ({at(varied[k])}) has one value (std 0; min, max, last and median "
            "equal the mean): expected it left out of varied",
        )
    read = _Metric(
        col, rows, np.array([counts[r] for r in row_list], np.int64), mean, full["std"],
        full["min"], full["max"], full["last"], full["median"], no_median,
    )  # fmt: skip
    _check(metric, read, entry)
    return read


def _at(entry: Callable[[int], str], rows: list[int], name: str) -> Callable[[int], str]:
    """The path of field `name` of the k-th statistic of a column over `rows`."""
    return lambda k: f"{entry(rows[k])}.{name}"


def _varied(value: Any, rows: npt.NDArray[np.intp], n: int, metric: str, where: str) -> list[int]:
    """The varied keys' rows: increasing, each a key with a statistic of `metric` (`true`:
    every one of them, and then only so)."""
    if value is True:
        return list(rows.tolist())
    listed = ints(value, None, False, lambda k: f"{where}[{k}]", where)
    if len(listed) == len(rows) and listed == rows.tolist():
        raise FileError(where, "expected true (every key with a statistic is listed)")
    has = np.zeros(n, bool)
    has[rows] = True
    for k, row in enumerate(listed):
        if not 0 <= row < n or not has[row]:
            raise FileError(
                f"{where}[{k}]", f"expected a key with a statistic of {metric} (a count), got {row}"
            )
        if k and row <= listed[k - 1]:
            got = f"got {row} after {listed[k - 1]}"
            raise FileError(f"{where}[{k}]", f"expected increasing rows, {got}")
    return listed


def _check(metric: str, m: _Metric, entry: Callable[[int], str]) -> None:
    """Every rule of `profile_schema` for these statistics: a screen over all at once, then
    the record rules for each one it flags (the screen flags every one they refuse)."""
    with np.errstate(invalid="ignore"):  # (NaN compares false: it passes, as in version 7)
        bad = (m.count < 0) | (m.std < 0) | (m.min > m.max)
        bounded = ~m.no_median & np.isfinite(m.min) & np.isfinite(m.max) & np.isfinite(m.median)
        bad |= bounded & ((m.median < m.min) | (m.median > m.max))
        if metric in NON_NEGATIVE_METRICS:
            bad |= m.min < 0
        if metric in TIME_METRICS:
            for values in (m.mean, m.std, m.min, m.max, m.last):
                bad |= np.abs(values) > TIME_LIMIT_MS
            bad |= ~m.no_median & (np.abs(m.median) > TIME_LIMIT_MS)
    for k in np.flatnonzero(bad).tolist():
        median = None if m.no_median[k] else float(m.median[k])
        stat = RunningStat(
            int(m.count[k]), float(m.mean[k]), float(m.std[k]), float(m.min[k]),
            float(m.max[k]), float(m.last[k]), median,
        )  # fmt: skip
        check_statistic(metric, stat, entry(int(m.rows[k])))
