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

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

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


_FIELDS = ("count", "mean", "std", "min", "max", "last", "median")


class ColumnMetrics(Mapping[str, RunningStat]):
    """Metric name -> `RunningStat` of one row of a `StatColumns` (a read-only mapping that
    compares equal to the dict of the same statistics)."""

    __slots__ = ("_columns", "_row", "_stats")
    medians_known = True  # running statistics always keep their median

    def __init__(self, columns: StatColumns, row: int) -> None:
        self._columns = columns
        self._row = row
        self._stats: dict[str, RunningStat] | None = None

    def _built(self) -> dict[str, RunningStat]:
        stats = self._stats
        if stats is None:
            cols, row = self._columns, self._row
            # one C call per field for the whole row, not one per value
            counts, means, stds, mins, maxs, lasts, medians = (
                getattr(cols, name)[row].tolist() for name in _FIELDS
            )
            stats = self._stats = {}
            for i, metric in enumerate(METRICS):
                if counts[i]:
                    stats[metric] = frozen(
                        RunningStat,
                        {
                            "count": counts[i], "mean": means[i], "std": stds[i],
                            "min": mins[i], "max": maxs[i], "last": lasts[i],
                            "median": medians[i],
                        },
                    )  # fmt: skip
        return stats

    def __getitem__(self, metric: str) -> RunningStat:
        return self._built()[metric]

    def __iter__(self) -> Iterator[str]:
        return iter(self._built())

    def __len__(self) -> int:
        return len(self._built())

    def __contains__(self, metric: object) -> bool:
        return metric in self._built()

    def __repr__(self) -> str:
        return repr(self._built())

    def __reduce__(self) -> tuple[type[ColumnMetrics], tuple[StatColumns, int]]:
        # the columns pickle once per profile (pickle's memo), not once per call key
        return (ColumnMetrics, (self._columns, self._row))
