"""The running statistics of every call key at one moment, as arrays: a row per call key, a
column per metric (`METRICS` order). `ModuleStats.metrics` reads its row through
`ColumnMetrics`, which builds the `RunningStat`s of a row the first time any is read.

Why: freezing a 10,000-call profile into objects built ~160,000 `RunningStat`s after every
sample, while the table reads the metrics of the ~3,000 calls its views draw. The arrays are a
copy (later samples do not change a snapshot), pickle as one block (the worker process sends a
profile back in one piece), and a row's statistics are the same `RunningStat` values the
objects held.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from operator import attrgetter
from typing import Any

import numpy as np
import numpy.typing as npt

from wandb_modprof.records.frozen import frozen
from wandb_modprof.records.sample import METRICS, RunningStat

Floats = npt.NDArray[np.float64]


@dataclass(frozen=True, eq=False)
class StatColumns:
    """Statistics of `rows` call keys x `METRICS`; `count` 0: the metric was never measured
    for that key (no statistic: absent from its `ColumnMetrics`)."""

    count: npt.NDArray[np.int64]
    mean: Floats
    std: Floats
    min: Floats
    max: Floats
    last: Floats
    median: Floats

    def typicals(self, col: int) -> list[float | None]:
        """Per row the median of metric column `col`, None where never measured: one C call
        for every row, kept (ranking a view reads the forward and backward of every call)."""
        cache: dict[int, list[float | None]] = self.__dict__.setdefault("_typicals", {})
        out = cache.get(col)
        if out is None:
            measured = self.count[:, col] > 0
            values = self.median[:, col].tolist()
            out = cache[col] = [
                v if m else None for v, m in zip(values, measured.tolist(), strict=True)
            ]
        return out

    def __getstate__(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _FIELDS}  # not the `typicals` cache


_FIELDS = ("count", "mean", "std", "min", "max", "last", "median")
assert tuple(f.name for f in fields(RunningStat)) == _FIELDS, "`field_rows` follows RunningStat"


class ColumnMetrics(Mapping[str, RunningStat]):
    """Metric name -> `RunningStat` of one row of a `StatColumns` (a read-only mapping that
    compares equal to the dict of the same statistics). A statistic is built the first time
    it is read: ranking a view reads two metrics of every call, drawing it all of a few."""

    __slots__ = ("_cells", "_columns", "_row", "_stats")
    medians_known = True  # running statistics always keep their median

    def __init__(self, columns: StatColumns, row: int) -> None:
        self._columns = columns
        self._row = row
        self._cells: tuple[list[Any], ...] | None = None  # the row's fields, as Python values
        self._stats: dict[str, RunningStat] = {}

    def _row_values(self) -> tuple[list[Any], ...]:
        values = self._cells
        if values is None:
            cols, row = self._columns, self._row
            # one C call per field for the whole row, not one per value
            values = self._cells = tuple(getattr(cols, name)[row].tolist() for name in _FIELDS)
        return values

    def __getitem__(self, metric: str) -> RunningStat:
        stat = self._stats.get(metric)
        if stat is None:
            i = METRIC_INDEX[metric]  # KeyError: not a metric
            counts, means, stds, mins, maxs, lasts, medians = self._row_values()
            if not counts[i]:
                raise KeyError(metric)  # never measured for this call key
            stat = self._stats[metric] = frozen(
                RunningStat,
                {
                    "count": counts[i], "mean": means[i], "std": stds[i], "min": mins[i],
                    "max": maxs[i], "last": lasts[i], "median": medians[i],
                },
            )  # fmt: skip
        return stat

    def typical(self, metric: str) -> float | None:
        """`self[metric].typical` (the median), None where not measured, without building the
        `RunningStat`: ranking reads it for every call of a view."""
        i = METRIC_INDEX.get(metric)
        return None if i is None else self._columns.typicals(i)[self._row]

    def count(self, metric: str) -> int:
        """`self[metric].count`, 0 where never measured (or not a metric), without building
        the `RunningStat`."""
        i = METRIC_INDEX.get(metric)
        count: int = 0 if i is None else self._row_values()[0][i]
        return count

    def value_columns(self, spread: Collection[str]) -> dict[str, float]:
        """The table's value columns of this row: per measured metric its median under the
        metric's name and, for the metrics in `spread`, `<metric>_mean`, `_std`, `_min`, `_max`
        and `_last`. The values reading each `RunningStat` gives, without building them (a
        10,000-call table reads ~3,000 rows of ~25 metrics)."""
        counts, means, stds, mins, maxs, lasts, medians = self._row_values()
        out: dict[str, float] = {}
        for i, metric in enumerate(METRICS):
            if counts[i]:
                out[metric] = medians[i]
                if metric in spread:
                    out[f"{metric}_mean"] = means[i]
                    out[f"{metric}_std"] = stds[i]
                    out[f"{metric}_min"] = mins[i]
                    out[f"{metric}_max"] = maxs[i]
                    out[f"{metric}_last"] = lasts[i]
        return out

    row_type = RunningStat  # what `field_rows` gives the fields of

    def field_rows(self) -> Iterator[tuple[str, tuple[Any, ...]]]:
        """Per measured metric, its `RunningStat`'s fields in their order, without building
        it (the profile file writes every statistic of every call: ~200,000 at 10,000)."""
        counts, means, stds, mins, maxs, lasts, medians = self._row_values()
        for i, metric in enumerate(METRICS):
            if counts[i]:
                yield metric, (counts[i], means[i], stds[i], mins[i], maxs[i], lasts[i], medians[i])

    def __iter__(self) -> Iterator[str]:
        counts = self._row_values()[0]
        return (metric for i, metric in enumerate(METRICS) if counts[i])

    def __len__(self) -> int:
        return sum(1 for count in self._row_values()[0] if count)

    def __contains__(self, metric: object) -> bool:
        i = METRIC_INDEX.get(metric) if isinstance(metric, str) else None
        return i is not None and bool(self._row_values()[0][i])

    def __repr__(self) -> str:
        return repr(dict(self.items()))

    def __reduce__(self) -> tuple[type[ColumnMetrics], tuple[StatColumns, int]]:
        # the columns pickle once per profile (pickle's memo), not once per call key
        return (ColumnMetrics, (self._columns, self._row))


METRIC_INDEX = {metric: i for i, metric in enumerate(METRICS)}  # column of each metric


def shared_rows(metrics: Sequence[object]) -> tuple[StatColumns, list[int]] | None:
    """The arrays `metrics` read and the row of each, where every one is a `ColumnMetrics` of
    the same arrays (a snapshot's statistics); None otherwise. The profile file writes the
    statistics of every row from the arrays at once."""
    if not metrics or set(map(type, metrics)) != {ColumnMetrics}:
        return None
    pairs = list(map(_source, metrics))  # (C loops: 10,000 calls' statistics in a few ms)
    if len(set(map(id, (columns for columns, _ in pairs)))) != 1:
        return None
    return pairs[0][0], [row for _, row in pairs]


_source = attrgetter("_columns", "_row")
